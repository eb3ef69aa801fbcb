//! Container logs in the CRI format the kubelet and `kubectl logs` read:
//! `<RFC3339Nano> <stdout|stderr> <F|P> <line>`, one file per container
//! start (`<container>/<restartCount>.log`), rotated by size.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Lines longer than this are split into `P` (partial) records, as
/// containerd does.
pub const MAX_LINE: usize = 16 * 1024;

/// One log file, shared by a container's stdout and stderr.
#[derive(Debug)]
pub struct LogFile {
    path: PathBuf,
    file: Option<File>,
    size: u64,
    max_size: u64,
    max_files: u32,
}

impl LogFile {
    pub fn open(path: &Path, max_size: u64, max_files: u32) -> std::io::Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = open_log(path)?;
        let size = file.metadata()?.len();
        Ok(LogFile {
            path: path.to_path_buf(),
            file: Some(file),
            size,
            max_size,
            max_files: max_files.max(1),
        })
    }

    /// Writes one record.
    pub fn record(&mut self, stream: &str, partial: bool, line: &[u8]) {
        let ts = jiff::Timestamp::now();
        let mut rec = Vec::with_capacity(line.len() + 48);
        let _ = write!(rec, "{ts} {stream} {} ", if partial { 'P' } else { 'F' });
        rec.extend_from_slice(line);
        rec.push(b'\n');
        if self.max_size > 0 && self.size + rec.len() as u64 > self.max_size && self.size > 0 {
            self.rotate();
        }
        if self
            .append(&rec)
            .is_err_and(|e| e.raw_os_error() == Some(libc::ENOSPC))
        {
            // A full filesystem (logs on a small tmpfs): this container's
            // rotated files go first, then the record is tried once more;
            // else it is dropped, and the pod runs on.
            kinglet_runtime::logs::prune_rotated(&self.path, 1);
            let _ = self.append(&rec);
        }
    }

    /// Appends a whole record or nothing: a record cut short (the
    /// filesystem filled in its middle) is cut off again, so that the next
    /// one does not glue onto half a line.
    fn append(&mut self, rec: &[u8]) -> std::io::Result<()> {
        let Some(f) = self.file.as_mut() else {
            return Ok(());
        };
        match f.write_all(rec) {
            Ok(()) => {
                self.size += rec.len() as u64;
                Ok(())
            }
            Err(e) => {
                let _ = f.set_len(self.size);
                Err(e)
            }
        }
    }

    /// `0.log` → `0.log.<YYYYMMDD-hhmmss.nnnnnnnnn>`; keeps `max_files`
    /// files in all, the current one included.
    fn rotate(&mut self) {
        let stamp = jiff::Timestamp::now()
            .strftime("%Y%m%d-%H%M%S.%f")
            .to_string();
        let rotated = PathBuf::from(format!("{}.{stamp}", self.path.display()));
        self.file = None;
        let _ = std::fs::rename(&self.path, &rotated);
        kinglet_runtime::logs::prune_rotated(&self.path, self.max_files);
        self.file = open_log(&self.path).ok();
        self.size = 0;
    }
}

/// A log file is 0640, as the kubelet's and containerd's: a container's
/// output is its pod's business, not every local user's.
fn open_log(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o640)
        .open(path)
}

/// Splits a stream's bytes into log records.
#[derive(Debug, Default)]
pub struct LineSplitter {
    pending: Vec<u8>,
}

impl LineSplitter {
    /// Feeds bytes; complete lines (and over-long partial ones) go to `out`.
    pub fn feed(&mut self, data: &[u8], mut out: impl FnMut(bool, &[u8])) {
        self.pending.extend_from_slice(data);
        let mut start = 0;
        while let Some(nl) = self.pending[start..].iter().position(|b| *b == b'\n') {
            let end = start + nl;
            let mut line = &self.pending[start..end];
            while line.len() > MAX_LINE {
                out(true, &line[..MAX_LINE]);
                line = &line[MAX_LINE..];
            }
            out(false, line);
            start = end + 1;
        }
        self.pending.drain(..start);
        while self.pending.len() > MAX_LINE {
            out(true, &self.pending[..MAX_LINE]);
            self.pending.drain(..MAX_LINE);
        }
    }

    /// At end of stream: what is left is a last, unterminated line, written
    /// as a partial record, as containerd does (so a reader adds no newline
    /// the container never wrote).
    pub fn finish(&mut self, mut out: impl FnMut(bool, &[u8])) {
        if !self.pending.is_empty() {
            out(true, &self.pending);
            self.pending.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cri_format_and_partial_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c/0.log");
        let mut f = LogFile::open(&p, 0, 5).unwrap();
        let mut s = LineSplitter::default();
        let long = vec![b'x'; MAX_LINE + 10];
        let mut input = b"hello\nwor".to_vec();
        s.feed(&input, |partial, l| f.record("stdout", partial, l));
        input = b"ld\n".to_vec();
        input.extend_from_slice(&long);
        input.push(b'\n');
        s.feed(&input, |partial, l| f.record("stderr", partial, l));
        s.feed(b"tail", |partial, l| f.record("stdout", partial, l));
        s.finish(|partial, l| f.record("stdout", partial, l));
        let text = std::fs::read_to_string(&p).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5, "{text}");
        let fields: Vec<Vec<&str>> = lines.iter().map(|l| l.splitn(4, ' ').collect()).collect();
        assert!(fields[0][0].ends_with('Z') && fields[0][0].contains('T'));
        assert_eq!(&fields[0][1..], ["stdout", "F", "hello"]);
        assert_eq!(&fields[1][1..], ["stderr", "F", "world"]);
        assert_eq!((fields[2][2], fields[2][3].len()), ("P", MAX_LINE));
        assert_eq!((fields[3][2], fields[3][3]), ("F", "xxxxxxxxxx"));
        // The stream ended mid-line: a partial record, as containerd writes it.
        assert_eq!(&fields[4][1..], ["stdout", "P", "tail"]);
    }

    #[test]
    fn rotates_by_size_keeping_max_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("0.log");
        let mut f = LogFile::open(&p, 200, 3).unwrap();
        for i in 0..40 {
            f.record(
                "stdout",
                false,
                format!("line {i:03} padding padding").as_bytes(),
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(files.len(), 3, "{files:?}");
        assert!(std::fs::metadata(&p).unwrap().len() <= 200);
        assert!(std::fs::read_to_string(&p).unwrap().contains("line 039"));
    }
}
