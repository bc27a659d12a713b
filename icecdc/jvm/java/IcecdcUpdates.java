// Compiled in the driver's JVM at run time by Janino, the compiler Spark ships for its own
// generated code (icecdc/jvm/bridge.py, JavaBridge.updates), so icecdc needs no Java build.
// Janino erases generics: every value taken out of a collection or a JSON tree is cast.
//
// Why it exists: each py4j call is a round trip holding Python's GIL, and every Java object it
// hands back costs another when Python frees it. Building an ingest commit file by file took
// 136 round trips for a batch's 24 files (parse each file's JSON, make the file, add it), and
// py4j's finalizer some 5,000 more a batch over 50 tables to free them. These methods take a
// table's whole batch in one call, and find the commit in the history in another: six round trips
// a commit, where there were 18 (docs/BENCHMARKS.md, "Ingest over 50 tables").
//
// A file's description (ingest/filemeta.py) carries its Parquet footer, not its metrics: they
// are computed here, by Iceberg's own code with the table's metrics configuration, so they are
// exactly what Iceberg's writers register.

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collections;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutorService;

import org.apache.iceberg.ContentFileParser;
import org.apache.iceberg.DataFile;
import org.apache.iceberg.DataFiles;
import org.apache.iceberg.DeleteFile;
import org.apache.iceberg.FileMetadata;
import org.apache.iceberg.HasTableOperations;
import org.apache.iceberg.Metrics;
import org.apache.iceberg.MetricsConfig;
import org.apache.iceberg.OverwriteFiles;
import org.apache.iceberg.PartitionSpec;
import org.apache.iceberg.RowDelta;
import org.apache.iceberg.Snapshot;
import org.apache.iceberg.SnapshotRef;
import org.apache.iceberg.SnapshotUpdate;
import org.apache.iceberg.Table;
import org.apache.iceberg.TableMetadata;
import org.apache.iceberg.TableOperations;
import org.apache.iceberg.exceptions.CommitFailedException;
import org.apache.iceberg.expressions.Expressions;
import org.apache.iceberg.parquet.ParquetUtil;
import org.apache.iceberg.shaded.com.fasterxml.jackson.databind.JsonNode;
import org.apache.iceberg.shaded.org.apache.parquet.format.converter.ParquetMetadataConverter;
import org.apache.iceberg.shaded.org.apache.parquet.hadoop.metadata.ParquetMetadata;
import org.apache.iceberg.util.JsonUtil;
import org.apache.iceberg.util.SnapshotUtil;

public class IcecdcUpdates {

    /** The description's field with the file's footer, base64 (ingest/filemeta.py, FOOTER_FIELD). */
    static final String FOOTER = "icecdc-parquet-footer";

    /** The footer's metrics and split offsets in a copy of ``file`` (as parsed from its
     *  description, without metrics). */
    private DataFile withMetrics(DataFile file, JsonNode description, Map specs, MetricsConfig metrics)
            throws IOException {
        ParquetMetadata footer = footer(description);
        return DataFiles.builder((PartitionSpec) specs.get(Integer.valueOf(file.specId())))
            .copy(file)
            .withMetrics(metrics(footer, metrics))
            .withSplitOffsets(ParquetUtil.getSplitOffsets(footer))
            .build();
    }

    private DeleteFile withMetrics(DeleteFile file, JsonNode description, Map specs, MetricsConfig metrics)
            throws IOException {
        ParquetMetadata footer = footer(description);
        // The builder's copy leaves the equality field ids out: they are given again.
        List ids = file.equalityFieldIds();
        int[] equalityIds = new int[ids.size()];
        for (int i = 0; i < equalityIds.length; i++) {
            equalityIds[i] = ((Integer) ids.get(i)).intValue();
        }
        return FileMetadata.deleteFileBuilder((PartitionSpec) specs.get(Integer.valueOf(file.specId())))
            .copy(file)
            .ofEqualityDeletes(equalityIds)
            .withMetrics(metrics(footer, metrics))
            .withSplitOffsets(ParquetUtil.getSplitOffsets(footer))
            .build();
    }

    private static ParquetMetadata footer(JsonNode description) throws IOException {
        JsonNode encoded = description.get(FOOTER);
        if (encoded == null) {
            // Registered without it, the file would have no metrics: no pruning, no bounds.
            throw new IllegalArgumentException("the description of " + description.get("file-path") + " has no " + FOOTER);
        }
        byte[] bytes = Base64.getDecoder().decode(encoded.asText());
        // A converter a footer: commits run on several threads, and the converter keeps caches.
        return new ParquetMetadataConverter().readParquetMetadata(new ByteArrayInputStream(bytes), ParquetMetadataConverter.NO_FILTER);
    }

    private static Metrics metrics(ParquetMetadata footer, MetricsConfig config) {
        // No field metrics from a writer: every metric comes from the footer's statistics.
        return ParquetUtil.footerMetrics(footer, Collections.emptyList().stream(), config);
    }

    private DataFile dataFile(JsonNode description, Map specs, MetricsConfig metrics) throws IOException {
        return withMetrics((DataFile) ContentFileParser.fromJson(description, specs), description, specs, metrics);
    }

    private DeleteFile deleteFile(JsonNode description, Map specs, MetricsConfig metrics) throws IOException {
        return withMetrics((DeleteFile) ContentFileParser.fromJson(description, specs), description, specs, metrics);
    }

    /** The table's partition spec ids, comma-separated. */
    public String specIds(Table table) {
        StringBuilder ids = new StringBuilder();
        Iterator specs = table.specs().keySet().iterator();
        while (specs.hasNext()) {
            if (ids.length() > 0) {
                ids.append(',');
            }
            ids.append(specs.next());
        }
        return ids.toString();
    }

    /** A RowDelta adding the data and equality-delete files of two JSON arrays of Iceberg's
     *  content-file JSON, its manifest steps on ``executor``. */
    public RowDelta rowDelta(Table table, ExecutorService executor, String dataFiles, String deleteFiles)
            throws IOException {
        Map specs = table.specs();
        MetricsConfig metrics = MetricsConfig.forTable(table);
        RowDelta delta = (RowDelta) table.newRowDelta().scanManifestsWith(executor);
        JsonNode data = JsonUtil.mapper().readTree(dataFiles);
        for (int i = 0; i < data.size(); i++) {
            delta = delta.addRows(dataFile((JsonNode) data.get(i), specs, metrics));
        }
        JsonNode deletes = JsonUtil.mapper().readTree(deleteFiles);
        for (int i = 0; i < deletes.size(); i++) {
            delta = delta.addDeletes(deleteFile((JsonNode) deletes.get(i), specs, metrics));
        }
        return delta;
    }

    /** An overwrite removing every file of the table and adding the data files of a JSON array. */
    public OverwriteFiles overwriteAll(Table table, ExecutorService executor, String dataFiles) throws IOException {
        Map specs = table.specs();
        MetricsConfig metrics = MetricsConfig.forTable(table);
        OverwriteFiles overwrite =
            (OverwriteFiles) table.newOverwrite().overwriteByRowFilter(Expressions.alwaysTrue()).scanManifestsWith(executor);
        JsonNode data = JsonUtil.mapper().readTree(dataFiles);
        for (int i = 0; i < data.size(); i++) {
            overwrite = overwrite.addFile(dataFile((JsonNode) data.get(i), specs, metrics));
        }
        return overwrite;
    }

    /** The table refreshed, then the id of the head of ``branch`` (main's current snapshot while
     *  the branch does not exist, the snapshot a commit to it would start from); -1 when there is
     *  none (Iceberg's ids are positive). */
    public long refreshedSnapshotId(Table table, String branch) {
        table.refresh();
        Snapshot head = SnapshotUtil.latestSnapshot(table, branch);
        return head == null ? -1L : head.snapshotId();
    }

    /** Main moved to snapshot ``target`` in one metadata commit, if main is still at
     *  ``expectedMain`` (-1: no snapshot): a compare-and-set on the table's metadata, so two
     *  compactors never move main backwards. False when main had moved, or when other commits kept
     *  landing between the read and the swap; the caller decides again from a fresh read. */
    public boolean moveMain(Table table, long expectedMain, long target) {
        TableOperations ops = ((HasTableOperations) table).operations();
        for (int attempt = 0; attempt < 4; attempt++) {
            TableMetadata base = ops.refresh();
            Snapshot main = base.currentSnapshot();
            if ((main == null ? -1L : main.snapshotId()) != expectedMain) {
                return false;
            }
            TableMetadata moved = TableMetadata.buildFrom(base).setBranchSnapshot(target, SnapshotRef.MAIN_BRANCH).build();
            try {
                ops.commit(base, moved);
                table.refresh();
                return true;
            } catch (CommitFailedException landedMeanwhile) {
                // A writer commit to the staging branch swapped the metadata first: read again.
            }
        }
        return false;
    }

    private static Snapshot parent(Table table, Snapshot snapshot) {
        Long parentId = snapshot.parentId();
        return parentId == null ? null : table.snapshot(parentId.longValue());
    }

    /** The table refreshed, then the summaries of the head of ``branch`` and its ancestors, newest
     *  first, down to the first one that has ``key``, as a JSON array of objects: a batch's offsets
     *  read in one round trip a table. */
    public String refreshedSummariesBackTo(Table table, String branch, String key) throws IOException {
        table.refresh();
        List summaries = new ArrayList();
        for (Snapshot snapshot = SnapshotUtil.latestSnapshot(table, branch); snapshot != null; snapshot = parent(table, snapshot)) {
            summaries.add(snapshot.summary());
            if (snapshot.summary().containsKey(key)) {
                break;
            }
        }
        return JsonUtil.mapper().writeValueAsString(summaries);
    }

    /** The snapshot whose summary maps ``key`` to ``value`` (a commit's id), looked for from the
     *  head of ``branch`` (as of the last refresh) back to snapshot ``stopAt`` (-1: the whole
     *  history), as "id,parent,sequence number,timestamp ms,operation,interleaved" (parent -1 when
     *  none), where interleaved counts the snapshots after ``stopAt`` and before it: commits by
     *  others that it had to be applied on top of. Null when it is not there. One round trip
     *  where walking the history from Python took a dozen. */
    public String findTagged(Table table, String branch, String key, String value, long stopAt) {
        Snapshot found = null;
        int interleaved = 0;
        for (Snapshot snapshot = SnapshotUtil.latestSnapshot(table, branch); snapshot != null; snapshot = parent(table, snapshot)) {
            if (found == null && value.equals(snapshot.summary().get(key))) {
                found = snapshot;
            } else if (snapshot.snapshotId() == stopAt) {
                break;
            } else if (found != null) {
                interleaved++;
            }
        }
        if (found == null) {
            return null;
        }
        Long parentId = found.parentId();
        return found.snapshotId() + "," + (parentId == null ? -1L : parentId.longValue()) + "," + found.sequenceNumber()
            + "," + found.timestampMillis() + "," + found.operation() + "," + interleaved;
    }

    /** ``update`` committing to ``branch``, with every property of a JSON object of strings set in
     *  its snapshot summary. */
    public SnapshotUpdate tagged(SnapshotUpdate update, String branch, String summary) throws IOException {
        update = (SnapshotUpdate) update.toBranch(branch);
        JsonNode properties = JsonUtil.mapper().readTree(summary);
        Iterator names = properties.fieldNames();
        while (names.hasNext()) {
            String name = (String) names.next();
            update = (SnapshotUpdate) update.set(name, ((JsonNode) properties.get(name)).asText());
        }
        return update;
    }
}
