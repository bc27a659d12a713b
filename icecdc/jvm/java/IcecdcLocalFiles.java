// Compiled in the driver's JVM at run time by Janino (icecdc/jvm/bridge.py, JavaBridge.local_files).
//
// Why it exists: Hadoop's local file system, the one a warehouse on a local path goes through,
// sets every file it creates to its permission with `chmod` in a child process when Hadoop's
// native library is not loaded (pyspark ships none): RawLocalFileSystem.setPermission forks
// `chmod` through Shell.execCommand. An ingest commit writes four metadata files, so four
// processes a commit, about a third of a batch's commit time over 50 tables on two cores
// (docs/BENCHMARKS.md, "Ingest over 50 tables: Hadoop's chmod in process, metrics in the
// JVM"). Hadoop's own native path makes the same change with one
// system call (NativeIO.POSIX.chmod); this does it with java.nio's, which is the same call.

import java.io.IOException;
import java.lang.reflect.Field;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.HashSet;
import java.util.Set;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.FilterFileSystem;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

public class IcecdcLocalFiles {

    /** Hadoop's raw local file system, its permissions set in this process. */
    public static class InProcessChmod extends RawLocalFileSystem {
        public void setPermission(Path path, FsPermission permission) throws IOException {
            Files.setPosixFilePermissions(pathToFile(path).toPath(), posix(permission.toShort()));
        }
    }

    private static final PosixFilePermission[] BITS = {
        PosixFilePermission.OTHERS_EXECUTE, PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_READ,
        PosixFilePermission.GROUP_EXECUTE, PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_READ,
        PosixFilePermission.OWNER_EXECUTE, PosixFilePermission.OWNER_WRITE, PosixFilePermission.OWNER_READ,
    };

    /** The permission bits of ``mode`` (sticky, setuid and setgid bits have no java.nio form;
     *  Hadoop sets none on the files of a table). */
    static Set posix(short mode) {
        Set permissions = new HashSet();
        for (int bit = 0; bit < BITS.length; bit++) {
            if ((mode & (1 << bit)) != 0) {
                permissions.add(BITS[bit]);
            }
        }
        return permissions;
    }

    /** Puts ``InProcessChmod`` under the JVM's cached local file system (Hadoop caches file systems
     *  by scheme, so every user of local paths in this JVM shares it); true if it was not there. */
    public boolean install(Configuration conf) throws Exception {
        LocalFileSystem local = FileSystem.getLocal(conf);
        FileSystem raw = local.getRawFileSystem();
        if (raw.getClass().getName().endsWith("$InProcessChmod")) {
            return false;  // installed by another compilation of this class in the same JVM
        }
        InProcessChmod replacement = new InProcessChmod();
        replacement.initialize(raw.getUri(), raw.getConf());
        replacement.setWorkingDirectory(raw.getWorkingDirectory());
        Field wrapped = FilterFileSystem.class.getDeclaredField("fs");
        wrapped.setAccessible(true);
        wrapped.set(local, replacement);
        return true;
    }
}
