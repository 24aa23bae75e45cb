//! The exactly-once Kafka sink's transaction log: every record of an open transaction is also
//! appended to a local file, so that a transaction librdkafka aborted on recovery can be
//! written again.
//!
//! ```text
//!  <dir>/<transactional id>.open          records of the open transaction (appended as written)
//!  <dir>/<transactional id>.c<n>.log      the same file once the transaction is prepared for checkpoint n
//!                                         (fsynced, renamed, directory fsynced); removed after its commit
//! ```
//!
//! A record is `[key length: u32 LE, u32::MAX = no key][payload length: u32 LE][key][payload]`.
//! A checkpoint records the prepared log's length, record count and CRC-32, and a recovery
//! re-writes a log only if all three match: never a torn or foreign file.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

/// Write buffer of an open log.
const BUFFER_BYTES: usize = 64 * 1024;
/// Length marker of a record without a key.
const NO_KEY: u32 = u32::MAX;

/// A prepared log as a checkpoint records it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct LogRef {
    /// File name inside the log directory.
    pub file: String,
    pub bytes: u64,
    pub records: u64,
    pub crc32: u32,
}

/// The log of one producer's open transaction.
pub(crate) struct TxnLog {
    dir: PathBuf,
    /// File name stem: the transactional id, made file-safe.
    stem: String,
    file: BufWriter<File>,
    bytes: u64,
    records: u64,
    crc: crc32fast::Hasher,
}

/// A transactional id as a file name stem (letters, digits and `._-` kept, the rest `_`).
pub(crate) fn stem(transactional_id: &str) -> String {
    transactional_id.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).collect()
}

fn io_err(what: &'static str, path: &Path, source: std::io::Error) -> TxnLogError {
    TxnLogError::Io { what, path: path.to_owned(), source }
}

/// Why a transaction log could not be written or read back.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TxnLogError {
    /// A file operation failed.
    #[error("{what} {}: {}", path.display(), crate::util::io_error_text(source))]
    Io { what: &'static str, path: std::path::PathBuf, source: std::io::Error },
    /// The log is not what the checkpoint recorded: other length or checksum.
    #[error(
        "{}: {bytes} bytes with CRC-32 {crc32:08x}, but the checkpoint recorded {recorded_bytes} bytes with CRC-32 \
         {recorded_crc32:08x} (the file was changed or torn)",
        path.display()
    )]
    Changed { path: std::path::PathBuf, bytes: usize, crc32: u32, recorded_bytes: u64, recorded_crc32: u32 },
    /// A record runs past the end of the log.
    #[error("{}: the record at byte {at} is cut short", path.display())]
    CutShort { path: std::path::PathBuf, at: usize },
    /// Another number of records than the checkpoint recorded.
    #[error("{}: {records} records, the checkpoint recorded {recorded}", path.display())]
    Records { path: std::path::PathBuf, records: usize, recorded: u64 },
}

impl From<TxnLogError> for super::error::Problem {
    fn from(e: TxnLogError) -> super::error::Problem {
        super::error::Problem::from(e.to_string())
    }
}

/// fsync a directory (a rename or a create in it is durable after this).
pub(crate) fn sync_dir(dir: &Path) -> Result<(), TxnLogError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io_err("cannot fsync the directory", dir, e))
}

impl TxnLog {
    /// Start the log of a new transaction of `transactional_id` (truncating a leftover).
    pub(crate) fn create(dir: &Path, transactional_id: &str) -> Result<TxnLog, TxnLogError> {
        if !dir.is_dir() {
            std::fs::create_dir_all(dir).map_err(|e| io_err("cannot create the transaction log directory", dir, e))?;
            // The directory's entry must survive a crash too.
            if let Some(parent) = dir.parent() {
                sync_dir(parent)?;
            }
        }
        let stem = stem(transactional_id);
        let path = dir.join(format!("{stem}.open"));
        let file = File::create(&path).map_err(|e| io_err("cannot create the transaction log", &path, e))?;
        Ok(TxnLog {
            dir: dir.to_owned(),
            stem,
            file: BufWriter::with_capacity(BUFFER_BYTES, file),
            bytes: 0,
            records: 0,
            crc: crc32fast::Hasher::new(),
        })
    }

    /// Append one record.
    pub(crate) fn append(&mut self, key: Option<&[u8]>, payload: &[u8]) -> Result<(), TxnLogError> {
        let key_len = key.map_or(NO_KEY, |k| k.len() as u32);
        let mut head = [0u8; 8];
        head[..4].copy_from_slice(&key_len.to_le_bytes());
        head[4..].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        let key = key.unwrap_or_default();
        for part in [&head[..], key, payload] {
            self.crc.update(part);
            self.file.write_all(part).map_err(|e| self.error("cannot append to the transaction log", e))?;
        }
        self.bytes += (head.len() + key.len() + payload.len()) as u64;
        self.records += 1;
        Ok(())
    }

    /// `what` (`cannot write the transaction log`) failed on the open log.
    fn error(&self, what: &'static str, e: std::io::Error) -> TxnLogError {
        io_err(what, &self.dir.join(format!("{}.open", self.stem)), e)
    }

    /// The transaction is prepared for checkpoint `checkpoint`: make the log durable under its
    /// prepared name.
    pub(crate) fn prepare(mut self, checkpoint: u64) -> Result<LogRef, TxnLogError> {
        self.file.flush().map_err(|e| self.error("cannot write the transaction log", e))?;
        self.file.get_ref().sync_data().map_err(|e| self.error("cannot fsync the transaction log", e))?;
        let from = self.dir.join(format!("{}.open", self.stem));
        let file = prepared_name(&self.stem, checkpoint);
        let to = self.dir.join(&file);
        std::fs::rename(&from, &to).map_err(|e| io_err("cannot rename the transaction log", &from, e))?;
        sync_dir(&self.dir)?;
        Ok(LogRef { file, bytes: self.bytes, records: self.records, crc32: self.crc.finalize() })
    }
}

/// The file name of `stem`'s log prepared for `checkpoint`.
pub(crate) fn prepared_name(stem: &str, checkpoint: u64) -> String {
    format!("{stem}.c{checkpoint}.log")
}

/// One logged record: its key (if it had one) and payload.
pub(crate) type LoggedRecord = (Option<Vec<u8>>, Vec<u8>);

/// Read a prepared log back, checking it against what the checkpoint recorded.
pub(crate) fn read(dir: &Path, log: &LogRef) -> Result<Vec<LoggedRecord>, TxnLogError> {
    let path = dir.join(&log.file);
    let mut body = Vec::new();
    File::open(&path)
        .and_then(|mut f| f.read_to_end(&mut body))
        .map_err(|e| io_err("cannot read the transaction log", &path, e))?;
    if body.len() as u64 != log.bytes || crc32fast::hash(&body) != log.crc32 {
        return Err(TxnLogError::Changed {
            path,
            bytes: body.len(),
            crc32: crc32fast::hash(&body),
            recorded_bytes: log.bytes,
            recorded_crc32: log.crc32,
        });
    }
    let mut records = Vec::with_capacity(log.records as usize);
    let mut at = 0usize;
    let take = |at: &mut usize, n: usize| -> Option<&[u8]> {
        let s = body.get(*at..*at + n)?;
        *at += n;
        Some(s)
    };
    while at < body.len() {
        let record_at = at;
        let bad = || TxnLogError::CutShort { path: path.clone(), at: record_at };
        let head = take(&mut at, 8).ok_or_else(bad)?;
        let key_len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes"));
        let payload_len = u32::from_le_bytes(head[4..].try_into().expect("4 bytes")) as usize;
        let key = match key_len {
            NO_KEY => None,
            n => Some(take(&mut at, n as usize).ok_or_else(bad)?.to_vec()),
        };
        let payload = take(&mut at, payload_len).ok_or_else(bad)?.to_vec();
        records.push((key, payload));
    }
    if records.len() as u64 != log.records {
        return Err(TxnLogError::Records { path, records: records.len(), recorded: log.records });
    }
    Ok(records)
}

/// The checkpoint a file of `stem` belongs to (`<stem>.c<n>.log`), or `None` for an open log;
/// files of other stems are `Err(())`.
pub(crate) fn checkpoint_of(file: &str, stem: &str) -> Result<Option<u64>, ()> {
    let rest = file.strip_prefix(stem).and_then(|r| r.strip_prefix('.')).ok_or(())?;
    if rest == "open" {
        return Ok(None);
    }
    let n = rest.strip_prefix('c').ok_or(())?;
    n.strip_suffix(".log").and_then(|n| n.parse().ok()).map(Some).ok_or(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prepared_log_reads_back_and_a_changed_one_is_refused() {
        let dir = std::env::temp_dir().join(format!("weir-txnlog-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut log = TxnLog::create(&dir, "orders-0-1").unwrap();
        log.append(Some(b"k1"), b"first").unwrap();
        log.append(None, b"").unwrap();
        log.append(Some(b""), b"third").unwrap();
        let r = log.prepare(7).unwrap();
        assert_eq!((r.file.as_str(), r.records), ("orders-0-1.c7.log", 3));
        let back = read(&dir, &r).unwrap();
        assert_eq!(
            back,
            vec![(Some(b"k1".to_vec()), b"first".to_vec()), (None, Vec::new()), (Some(Vec::new()), b"third".to_vec())]
        );
        assert_eq!(checkpoint_of(&r.file, "orders-0-1"), Ok(Some(7)));
        assert_eq!(checkpoint_of("orders-0-1.open", "orders-0-1"), Ok(None));
        assert_eq!(checkpoint_of("orders-0-11.c7.log", "orders-0-1"), Err(()));

        let mut body = std::fs::read(dir.join(&r.file)).unwrap();
        body[9] ^= 1;
        std::fs::write(dir.join(&r.file), &body).unwrap();
        let e = read(&dir, &r).unwrap_err().to_string();
        assert!(e.contains("changed or torn"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
