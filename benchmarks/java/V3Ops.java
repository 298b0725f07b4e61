import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.apache.bookkeeper.client.BookKeeper;
import org.apache.bookkeeper.client.BookieInfoReader.BookieInfo;
import org.apache.bookkeeper.client.LedgerHandle;
import org.apache.bookkeeper.client.api.LastConfirmedAndEntry;
import org.apache.bookkeeper.conf.ClientConfiguration;
import org.apache.bookkeeper.net.BookieId;

/**
 * The v3 operations a Java 4.14 client uses beyond add and read, against the cluster at ZooKeeper a[0]
 * (benchmarks/java_v3_check.sh compiles and runs it): GET_BOOKIE_INFO, a long-poll read
 * (readLastAddConfirmedAndEntry: previousLAC, timeout, entry piggyback), WRITE_LAC (explicit LAC
 * flushes of an idle writer) and READ_LAC (readExplicitLastConfirmed), FORCE_LEDGER (force()).
 * Prints one RESULT line per check.
 */
public class V3Ops {
    static final byte[] PW = "testpasswd".getBytes(StandardCharsets.UTF_8);

    static void result(String what, boolean ok, Object detail) {
        System.out.println("RESULT " + (ok ? "ok " : "fail ") + what + ": " + detail);
    }

    static ClientConfiguration conf(String zk, int explicitLacMs) {
        ClientConfiguration c = new ClientConfiguration();
        c.setMetadataServiceUri("zk+null://" + zk + "/ledgers");
        c.setExplictLacInterval(explicitLacMs);  // (sic: Java's spelling) an idle writer sends WRITE_LAC
        c.setAddEntryTimeout(30);
        c.setReadEntryTimeout(30);
        return c;
    }

    static LedgerHandle write(BookKeeper bk, int entries) throws Exception {
        LedgerHandle lh = bk.createLedger(3, 3, 2, BookKeeper.DigestType.CRC32, PW);
        for (int i = 0; i < entries; i++) {
            lh.addEntry(("L" + lh.getId() + "-E" + i).getBytes(StandardCharsets.UTF_8));
        }
        return lh;
    }

    public static void main(String[] a) throws Exception {
        try (BookKeeper bk = new BookKeeper(conf(a[0], 0));
             BookKeeper lacWriter = new BookKeeper(conf(a[0], 100));
             BookKeeper reader = new BookKeeper(conf(a[0], 0))) {
            Map<BookieId, BookieInfo> info = bk.getBookieInfo();
            boolean sane = !info.isEmpty();
            for (BookieInfo i : info.values()) {
                sane &= i.getFreeDiskSpace() > 0 && i.getTotalDiskSpace() >= i.getFreeDiskSpace();
            }
            result("GET_BOOKIE_INFO", sane, info);

            LedgerHandle lh = write(bk, 10);
            LedgerHandle rh = reader.openLedgerNoRecovery(lh.getId(), BookKeeper.DigestType.CRC32, PW);
            long lac = rh.readLastConfirmed();
            // Entry lac + 1 is not confirmed yet: the bookies hold the poll until an add carries a higher LAC.
            CompletableFuture<LastConfirmedAndEntry> poll = rh.readLastAddConfirmedAndEntryAsync(lac + 1, 10_000, false);
            Thread.sleep(300);
            boolean waited = !poll.isDone();
            lh.addEntry(("L" + lh.getId() + "-E10").getBytes(StandardCharsets.UTF_8));
            LastConfirmedAndEntry got = poll.get(15, TimeUnit.SECONDS);
            boolean polled = waited && got.hasEntry() && got.getEntry().getEntryId() == lac + 1
                && got.getLastAddConfirmed() >= lac + 1
                && new String(got.getEntry().getEntryBytes(), StandardCharsets.UTF_8).equals("L" + lh.getId() + "-E" + (lac + 1));
            result("long-poll READ_ENTRY (piggyback)", polled,
                "lac before " + lac + ", waited " + waited + ", got lac " + got.getLastAddConfirmed()
                + (got.hasEntry() ? ", entry " + got.getEntry().getEntryId() : ", no entry"));

            LedgerHandle idle = write(lacWriter, 5);
            Thread.sleep(1_000);  // the writer is idle: its explicit LAC (4) goes out as WRITE_LAC
            LedgerHandle ih = reader.openLedgerNoRecovery(idle.getId(), BookKeeper.DigestType.CRC32, PW);
            long explicit = ih.readExplicitLastConfirmed();
            result("WRITE_LAC + READ_LAC", explicit == idle.getLastAddConfirmed() && explicit == 4,
                "explicit LAC " + explicit + ", writer's LAC " + idle.getLastAddConfirmed()
                + ", LAC from entries " + ih.readLastConfirmed());
            idle.close();

            lh.force().get(15, TimeUnit.SECONDS);
            result("FORCE_LEDGER", true, "force() completed");
            lh.close();
            rh.close();
        } catch (Exception e) {
            result("v3 operations", false, e);
        }
        System.exit(0);
    }
}
