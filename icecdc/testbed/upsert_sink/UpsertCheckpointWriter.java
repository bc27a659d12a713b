// A Flink-style upsert sink's files and commit, written with Iceberg's own Java writer classes.
// Compiled in the driver's JVM at run time by Janino (icecdc/testbed/upsert_sink/sink.py), which erases
// generics: every value taken out of a collection is cast.
//
// What it writes follows Flink's BaseDeltaTaskWriter in upsert mode: per partition one data file
// of new rows, one equality-delete file of keys (id only) and one position-delete file against
// that same data file (file-scoped), and commits one checkpoint as Flink's IcebergFilesCommitter
// does: a RowDelta with no validations, or an append when it has no deletes.

import java.io.IOException;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;

import org.apache.iceberg.AppendFiles;
import org.apache.iceberg.DataFile;
import org.apache.iceberg.DeleteFile;
import org.apache.iceberg.PartitionKey;
import org.apache.iceberg.RowDelta;
import org.apache.iceberg.Schema;
import org.apache.iceberg.SnapshotUpdate;
import org.apache.iceberg.Table;
import org.apache.iceberg.FileFormat;
import org.apache.iceberg.data.GenericAppenderFactory;
import org.apache.iceberg.data.GenericRecord;
import org.apache.iceberg.deletes.EqualityDeleteWriter;
import org.apache.iceberg.deletes.PositionDelete;
import org.apache.iceberg.deletes.PositionDeleteWriter;
import org.apache.iceberg.io.DataWriter;
import org.apache.iceberg.io.FileWriter;
import org.apache.iceberg.io.OutputFileFactory;
import org.apache.iceberg.io.WriteResult;
import org.apache.iceberg.shaded.com.fasterxml.jackson.databind.JsonNode;
import org.apache.iceberg.types.Types;
import org.apache.iceberg.util.DateTimeUtil;
import org.apache.iceberg.util.JsonUtil;

public class UpsertCheckpointWriter {

    /** The files of one checkpoint, described in one JSON string (one py4j call, however many
     *  rows): a list of partitions, each {"region", "rows": [[id, amount, status, updated_at in
     *  microseconds]], "equality": [ids], "positions": [sorted positions to delete]}. Positions
     *  point into the data file written here, as Flink's insertedRowMap only knows the rows of
     *  the running checkpoint. */
    public WriteResult write(Table table, String checkpoint, String operationId) throws IOException {
        Schema schema = table.schema();
        Schema keys = schema.select(new String[] {"id"});
        int[] equalityFieldIds = new int[] {schema.findField("id").fieldId()};
        GenericAppenderFactory files = new GenericAppenderFactory(
            table, schema, table.spec(), null, equalityFieldIds, keys, null);
        OutputFileFactory locations = OutputFileFactory.builderFor(table, 1, 1L)
            .format(FileFormat.PARQUET).operationId(operationId).build();
        List dataFiles = new ArrayList();
        List deleteFiles = new ArrayList();
        for (Iterator it = JsonUtil.mapper().readTree(checkpoint).elements(); it.hasNext(); ) {
            JsonNode partition = (JsonNode) it.next();
            PartitionKey key = partitionOf(table, ((JsonNode) partition.get("region")).asText());
            DataFile data = writeRows(files, locations, table, key, (JsonNode) partition.get("rows"));
            if (data != null) {
                dataFiles.add(data);
            }
            DeleteFile equality = writeEqualityDeletes(
                files, locations, table, key, keys, (JsonNode) partition.get("equality"));
            if (equality != null) {
                deleteFiles.add(equality);
            }
            JsonNode positions = (JsonNode) partition.get("positions");
            if (positions.size() > 0) {
                deleteFiles.add(writePositionDeletes(files, locations, table, key, data.location(), positions));
            }
        }
        return WriteResult.builder().addDataFiles(dataFiles).addDeleteFiles(deleteFiles).build();
    }

    /** Commit one checkpoint's files, tagged as Flink tags its commits; the new snapshot's id.
     *  Not ``engine-name``: Iceberg sets it to spark in a JVM where Spark's catalog runs. */
    public long commit(Table table, WriteResult result, String jobId, String operatorId, long checkpointId) {
        table.refresh();
        SnapshotUpdate update;
        if (result.deleteFiles().length == 0) {
            AppendFiles append = table.newAppend();
            for (int i = 0; i < result.dataFiles().length; i++) {
                append.appendFile(result.dataFiles()[i]);
            }
            update = append;
        } else {
            RowDelta delta = table.newRowDelta();
            for (int i = 0; i < result.dataFiles().length; i++) {
                delta.addRows(result.dataFiles()[i]);
            }
            for (int i = 0; i < result.deleteFiles().length; i++) {
                delta.addDeletes(result.deleteFiles()[i]);
            }
            update = delta;
        }
        update.set("flink.job-id", jobId);
        update.set("flink.operator-id", operatorId);
        update.set("flink.max-committed-checkpoint-id", Long.toString(checkpointId));
        update.commit();
        return table.currentSnapshot().snapshotId();
    }

    /** A timestamp column's value: with a zone as Spark's TIMESTAMP makes it, or without one. */
    private static Object timestamp(Schema schema, long micros) {
        Types.TimestampType type = (Types.TimestampType) schema.findType("updated_at");
        if (type.shouldAdjustToUTC()) {
            return DateTimeUtil.timestamptzFromMicros(micros);
        }
        return DateTimeUtil.timestampFromMicros(micros);
    }

    private static PartitionKey partitionOf(Table table, String region) {
        GenericRecord row = GenericRecord.create(table.schema());
        row.setField("region", region);
        PartitionKey key = new PartitionKey(table.spec(), table.schema());
        key.partition(row);
        return key;
    }

    private static DataFile writeRows(GenericAppenderFactory files, OutputFileFactory locations, Table table,
            PartitionKey key, JsonNode rows) throws IOException {
        if (rows.size() == 0) {
            return null;
        }
        List records = new ArrayList();
        for (Iterator it = rows.elements(); it.hasNext(); ) {
            JsonNode values = (JsonNode) it.next();
            GenericRecord row = GenericRecord.create(table.schema());
            row.setField("id", Long.valueOf(((JsonNode) values.get(0)).asLong()));
            row.setField("region", key.get(0, String.class));
            row.setField("amount", Long.valueOf(((JsonNode) values.get(1)).asLong()));
            row.setField("status", ((JsonNode) values.get(2)).isNull() ? null : ((JsonNode) values.get(2)).asText());
            row.setField("updated_at", timestamp(table.schema(), ((JsonNode) values.get(3)).asLong()));
            records.add(row);
        }
        DataWriter writer = files.newDataWriter(locations.newOutputFile(table.spec(), key), FileFormat.PARQUET, key);
        writeAll(writer, records);
        return writer.toDataFile();
    }

    private static DeleteFile writeEqualityDeletes(GenericAppenderFactory files, OutputFileFactory locations,
            Table table, PartitionKey key, Schema keys, JsonNode ids) throws IOException {
        if (ids.size() == 0) {
            return null;
        }
        List records = new ArrayList();
        for (Iterator it = ids.elements(); it.hasNext(); ) {
            GenericRecord row = GenericRecord.create(keys);
            row.setField("id", Long.valueOf(((JsonNode) it.next()).asLong()));
            records.add(row);
        }
        EqualityDeleteWriter writer = files.newEqDeleteWriter(
            locations.newOutputFile(table.spec(), key), FileFormat.PARQUET, key);
        writeAll(writer, records);
        return writer.toDeleteFile();
    }

    private static DeleteFile writePositionDeletes(GenericAppenderFactory files, OutputFileFactory locations,
            Table table, PartitionKey key, String dataFile, JsonNode positions) throws IOException {
        List deletes = new ArrayList();
        for (Iterator it = positions.elements(); it.hasNext(); ) {
            deletes.add(PositionDelete.create().set(dataFile, ((JsonNode) it.next()).asLong()));
        }
        PositionDeleteWriter writer = files.newPosDeleteWriter(
            locations.newOutputFile(table.spec(), key), FileFormat.PARQUET, key);
        writeAll(writer, deletes);
        return writer.toDeleteFile();
    }

    private static void writeAll(FileWriter writer, List records) throws IOException {
        try {
            for (Iterator it = records.iterator(); it.hasNext(); ) {
                writer.write(it.next());
            }
        } finally {
            writer.close();
        }
    }
}
