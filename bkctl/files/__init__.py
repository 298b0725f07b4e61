"""Read-only, streaming readers of a bookie's files (journal, entry log, index, lastMark).

They open files read-only, read them in chunks of limits.FILE_READ_CHUNK (memory stays bounded whatever
the file size), never write or create anything, and drive the pure codecs in bkctl.protocol. The inspect
commands render what they yield; the bookie's crash replay reuses the same scans.
"""
