// Compiled in the driver's JVM at run time by Janino, the compiler Spark ships for its own
// generated code (icecdc/jvm/bridge.py, JavaBridge.updates), so icecdc needs no Java build.
// Janino erases generics: every value taken out of a collection or a JSON tree is cast.
//
// Why it exists: each py4j call is a round trip holding Python's GIL, and every Java object it
// hands back costs another when Python frees it. Building an ingest commit file by file took
// 136 round trips for a batch's 24 files (parse each file's JSON, make the file, add it), and
// py4j's finalizer some 5,000 more a batch over 50 tables to free them. These methods take a
// table's whole batch in one call: 18 round trips a commit (docs/BENCHMARKS.md, "Ingest over
// 50 tables").

import java.io.IOException;
import java.util.Iterator;
import java.util.Map;
import java.util.concurrent.ExecutorService;

import org.apache.iceberg.ContentFileParser;
import org.apache.iceberg.DataFile;
import org.apache.iceberg.DeleteFile;
import org.apache.iceberg.OverwriteFiles;
import org.apache.iceberg.RowDelta;
import org.apache.iceberg.SnapshotUpdate;
import org.apache.iceberg.Table;
import org.apache.iceberg.expressions.Expressions;
import org.apache.iceberg.shaded.com.fasterxml.jackson.databind.JsonNode;
import org.apache.iceberg.util.JsonUtil;

public class IcecdcUpdates {

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
        RowDelta delta = (RowDelta) table.newRowDelta().scanManifestsWith(executor);
        JsonNode data = JsonUtil.mapper().readTree(dataFiles);
        for (int i = 0; i < data.size(); i++) {
            delta = delta.addRows((DataFile) ContentFileParser.fromJson((JsonNode) data.get(i), specs));
        }
        JsonNode deletes = JsonUtil.mapper().readTree(deleteFiles);
        for (int i = 0; i < deletes.size(); i++) {
            delta = delta.addDeletes((DeleteFile) ContentFileParser.fromJson((JsonNode) deletes.get(i), specs));
        }
        return delta;
    }

    /** An overwrite removing every file of the table and adding the data files of a JSON array. */
    public OverwriteFiles overwriteAll(Table table, ExecutorService executor, String dataFiles) throws IOException {
        Map specs = table.specs();
        OverwriteFiles overwrite =
            (OverwriteFiles) table.newOverwrite().overwriteByRowFilter(Expressions.alwaysTrue()).scanManifestsWith(executor);
        JsonNode data = JsonUtil.mapper().readTree(dataFiles);
        for (int i = 0; i < data.size(); i++) {
            overwrite = overwrite.addFile((DataFile) ContentFileParser.fromJson((JsonNode) data.get(i), specs));
        }
        return overwrite;
    }

    /** ``update`` with every property of a JSON object of strings set in its snapshot summary. */
    public SnapshotUpdate tagged(SnapshotUpdate update, String summary) throws IOException {
        JsonNode properties = JsonUtil.mapper().readTree(summary);
        Iterator names = properties.fieldNames();
        while (names.hasNext()) {
            String name = (String) names.next();
            update = (SnapshotUpdate) update.set(name, ((JsonNode) properties.get(name)).asText());
        }
        return update;
    }
}
