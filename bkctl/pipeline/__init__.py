"""The Spark replica audit (`bkctl audit`): the only part of bkctl that imports pyspark."""
