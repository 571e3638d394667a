//! Output paths: whether a command may write where it was told to, checked before anything is written.
//!
//! Writers put their bytes in a file beside the output and rename it into place (or create the output and
//! write into it). Either way, an output that is one of the command's inputs — under any name: the same
//! path, another path to it, a hard or a symbolic link — would replace what the command reads, and one that
//! is a device, a FIFO, a socket or a directory would be replaced by a file (a device node deleted), block
//! the writer for good, or swallow the bytes. Files are compared by device and inode, so every name of an
//! input is caught.

use std::fs::FileType;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use crate::{StoreError, EXPERTS_FILE, MANIFEST_FILE};

/// What a command writes at its output path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputKind {
    /// A regular file, replacing a regular file there.
    File,
    /// A store directory (`titan convert --layout copy`), replacing only a directory that holds nothing but
    /// a store's files: `--force` is for an old store, never for a directory that happens to be there.
    Store,
}

/// Checks that `out` may be written as `kind` by a command that reads `inputs` (those that do not exist are
/// skipped): it is none of them, and where it exists it is what `kind` replaces. The error names the output
/// and why it is refused.
pub fn check_output(out: &Path, inputs: &[&Path], kind: OutputKind) -> Result<(), StoreError> {
    let refuse = |what: String| StoreError::Output {
        path: out.to_path_buf(),
        what,
    };
    // Followed through symbolic links: what a write to `out` would reach.
    let Ok(target) = std::fs::metadata(out) else {
        // Nothing there (or a dangling link, which a rename replaces): nothing of anyone's is replaced.
        return Ok(());
    };
    for input in inputs {
        let Ok(m) = std::fs::metadata(input) else { continue };
        if (m.dev(), m.ino()) == (target.dev(), target.ino()) {
            let how = if Path::new(input) == out {
                String::new()
            } else {
                format!(" (the same file as {})", input.display())
            };
            return Err(refuse(format!(
                "it is an input of this command{how}, which writing the output would destroy; name another output"
            )));
        }
    }
    let linked = std::fs::symlink_metadata(out).is_ok_and(|m| m.file_type().is_symlink());
    let is = if linked { "it is a symbolic link to" } else { "it is" };
    let ty = target.file_type();
    match kind {
        OutputKind::File if ty.is_file() => Ok(()),
        OutputKind::File => Err(refuse(format!(
            "{is} {}, not a regular file; name a file to write",
            describe(ty)
        ))),
        OutputKind::Store if ty.is_dir() => {
            let entries = std::fs::read_dir(out).map_err(StoreError::io(out))?;
            let mut others = Vec::new();
            for entry in entries {
                let name = entry.map_err(StoreError::io(out))?.file_name();
                if name != MANIFEST_FILE && name != EXPERTS_FILE {
                    others.push(name.to_string_lossy().into_owned());
                }
            }
            others.sort();
            match others.first() {
                None => Ok(()),
                Some(first) => Err(refuse(format!(
                    "it is a directory holding more than a store ({first}{}), which replacing it would delete; \
                     name a new directory",
                    if others.len() > 1 {
                        format!(" and {} more", others.len() - 1)
                    } else {
                        String::new()
                    }
                ))),
            }
        }
        OutputKind::Store => Err(refuse(format!(
            "{is} {}, not a store directory; name a directory to write",
            describe(ty)
        ))),
    }
}

fn describe(ty: FileType) -> &'static str {
    if ty.is_file() {
        "a regular file"
    } else if ty.is_dir() {
        "a directory"
    } else if ty.is_char_device() {
        "a character device"
    } else if ty.is_block_device() {
        "a block device"
    } else if ty.is_fifo() {
        "a FIFO (named pipe)"
    } else if ty.is_socket() {
        "a socket"
    } else {
        "a special file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(out: &Path, inputs: &[&Path], kind: OutputKind) -> String {
        let e = check_output(out, inputs, kind).unwrap_err();
        assert!(matches!(e, StoreError::Output { .. }), "{e}");
        e.to_string()
    }

    #[test]
    fn inputs_under_any_name_and_special_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let model = d.join("m.gguf");
        std::fs::write(&model, b"model").unwrap();
        std::fs::create_dir(d.join("x")).unwrap();
        let (hard, soft, dotted) = (d.join("hard.gguf"), d.join("soft.gguf"), d.join("x/../m.gguf"));
        std::fs::hard_link(&model, &hard).unwrap();
        std::os::unix::fs::symlink(&model, &soft).unwrap();
        let inputs = [model.as_path()];
        let msg = refused(&model, &inputs, OutputKind::File);
        assert!(
            msg.starts_with(&format!(
                "refusing to write {}: it is an input of this command",
                model.display()
            )),
            "{msg}"
        );
        for other in [&hard, &soft, &dotted] {
            let msg = refused(other, &inputs, OutputKind::File);
            assert!(
                msg.contains(&format!("(the same file as {})", model.display())),
                "{msg}"
            );
        }
        // A directory, a device through a link, a FIFO; a store where a file is, or over a directory of files.
        let msg = refused(d, &inputs, OutputKind::File);
        assert!(
            msg.ends_with("it is a directory, not a regular file; name a file to write"),
            "{msg}"
        );
        let full = d.join("full");
        std::os::unix::fs::symlink("/dev/full", &full).unwrap();
        assert!(refused(&full, &inputs, OutputKind::File).contains("it is a symbolic link to a character device"));
        let fifo = d.join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo reads the NUL-terminated path only.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(refused(&fifo, &inputs, OutputKind::File).contains("it is a FIFO (named pipe), not a regular file"));
        assert!(refused(&hard, &[], OutputKind::Store).contains("it is a regular file, not a store directory"));
        let msg = refused(d, &[], OutputKind::Store);
        assert!(
            msg.contains("it is a directory holding more than a store (fifo and 5 more)"),
            "{msg}"
        );

        // What may be written: a new path, another regular file, an empty directory or an old store.
        check_output(&d.join("new.gguf"), &inputs, OutputKind::File).unwrap();
        let other = d.join("other.npy");
        std::fs::write(&other, b"old").unwrap();
        check_output(&other, &inputs, OutputKind::File).unwrap();
        let store = d.join("m.titan");
        std::fs::create_dir(&store).unwrap();
        check_output(&store, &inputs, OutputKind::Store).unwrap();
        std::fs::write(store.join(MANIFEST_FILE), b"{}").unwrap();
        std::fs::write(store.join(EXPERTS_FILE), b"").unwrap();
        check_output(&store, &inputs, OutputKind::Store).unwrap();
    }
}
