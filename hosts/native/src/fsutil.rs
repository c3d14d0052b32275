//! Crash-safe file writes: write a temporary sibling, fsync it, rename it over the target.
//!
//! A reader (or a crash) sees either the old file or the complete new one, never a torn mix: the
//! rename is atomic on POSIX file systems when source and target are in the same directory.
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Writes `bytes` to `path` atomically (temporary file in the same directory + fsync + rename).
///
/// On error the target is untouched and the temporary file is removed.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomic_with(path, |f| f.write_all(bytes))
}

/// Like [`write_atomic`], but `fill` writes the content into the temporary file. If `fill` fails the
/// temporary file is deleted and the target keeps its old content.
pub fn write_atomic_with(
    path: &Path,
    fill: impl FnOnce(&mut File) -> io::Result<()>,
) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let file_name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not a file path", path.display()),
        )
    })?;
    let (tmp, mut file) = create_temp(&dir, &file_name.to_string_lossy())?;
    let result = (|| {
        fill(&mut file)?;
        file.flush()?;
        file.sync_all()?;
        drop(file);
        fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    sync_dir(&dir);
    Ok(())
}

/// Creates `.{name}.tmp.{pid}.{n}` in `dir`, never reusing an existing file.
fn create_temp(dir: &Path, name: &str) -> io::Result<(PathBuf, File)> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let pid = std::process::id();
    loop {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".{name}.tmp.{pid}.{n}"));
        match OpenOptions::new().write(true).create_new(true).open(&tmp) {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Makes the rename durable (POSIX needs an fsync of the directory). Best effort: some platforms and
/// file systems cannot open or sync a directory, and the data itself is already synced.
fn sync_dir(dir: &Path) {
    #[cfg(unix)]
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    #[cfg(not(unix))]
    let _ = dir;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::scratch_dir;

    fn leftovers(dir: &Path) -> Vec<String> {
        fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".tmp."))
            .collect()
    }

    #[test]
    fn writes_and_replaces() {
        let d = scratch_dir("atomic");
        let p = d.join("a.txt");
        write_atomic(&p, b"one").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"one");
        write_atomic(&p, b"two!").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two!");
        assert!(leftovers(&d).is_empty());
        fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn failed_fill_keeps_old_file_and_cleans_up() {
        let d = scratch_dir("atomic-fail");
        let p = d.join("a.txt");
        write_atomic(&p, b"precious").unwrap();
        let err = write_atomic_with(&p, |f| {
            f.write_all(b"half-writ")?;
            Err(io::Error::other("disk full"))
        })
        .unwrap_err();
        assert_eq!(err.to_string(), "disk full");
        assert_eq!(fs::read(&p).unwrap(), b"precious");
        assert!(leftovers(&d).is_empty());
        fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn missing_directory_is_an_error() {
        let d = scratch_dir("atomic-missing");
        let p = d.join("no/such/dir/a.txt");
        assert!(write_atomic(&p, b"x").is_err());
        fs::remove_dir_all(d).unwrap();
    }
}
