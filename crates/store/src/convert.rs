//! `convert`: copy every (layer, expert) slice of a GGUF's stacked expert tensors into an aligned record of
//! `experts.bin`, digest each record, and publish the store atomically.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use titan_gguf::GgufFile;

use titan_layout::ExpertLayout;

use crate::manifest::{Manifest, RecordEntry};
use crate::output::{check_output, OutputKind};
use crate::{StoreError, DEFAULT_ALIGNMENT, EXPERTS_FILE, MANIFEST_FILE, MIN_ALIGNMENT};

/// Large sequential writes: the copy is bound by the disk, not by syscalls.
const WRITE_BUFFER: usize = 8 << 20;

#[derive(Clone, Debug)]
pub struct ConvertOptions {
    /// Record alignment in bytes: a power of two, at least 512 (O_DIRECT's smallest block).
    pub alignment: u64,
    /// Replace an existing store at the output path.
    pub force: bool,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions {
            alignment: DEFAULT_ALIGNMENT,
            force: false,
        }
    }
}

/// Write the expert store of `gguf` to the directory `out`; `progress(done, total)` is called after each
/// record with source bytes copied so far.
///
/// Atomic: everything is written into `<out>.partial-<pid>` and fsynced, the manifest last, and only then
/// renamed to `out`, so a crash leaves at most a `.partial-` directory that `Store::open` refuses.
pub fn convert(
    gguf: &GgufFile,
    out: &Path,
    opts: &ConvertOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Manifest, StoreError> {
    let align = opts.alignment;
    if !align.is_power_of_two() || align < MIN_ALIGNMENT {
        return Err(StoreError::Alignment(align));
    }
    // Before `--force` is even looked at: it replaces an old store, never the model or a directory of files.
    check_output(out, &[gguf.path()], OutputKind::Store)?;
    let layout = ExpertLayout::of(gguf)?;
    if out.exists() && !opts.force {
        return Err(StoreError::Exists {
            path: out.to_path_buf(),
        });
    }
    remove_stale_partials(out);
    let partial = sibling(out, &format!("partial-{}", std::process::id()));
    if partial.exists() {
        fs::remove_dir_all(&partial).map_err(StoreError::io(&partial))?;
    }
    fs::create_dir_all(&partial).map_err(StoreError::io(&partial))?;
    let result = write_store(gguf, &layout, align, &partial, progress).and_then(|m| {
        publish(&partial, out)?;
        Ok(m)
    });
    if result.is_err() {
        // Best effort: the error being returned matters more than a failure to clean up after it.
        let _ = fs::remove_dir_all(&partial);
    }
    result
}

fn write_store(
    gguf: &GgufFile,
    layout: &ExpertLayout,
    align: u64,
    dir: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Manifest, StoreError> {
    let bin_path = dir.join(EXPERTS_FILE);
    let io = |e| StoreError::io(&bin_path)(e);
    let file = File::create(&bin_path).map_err(io)?;
    let mut w = BufWriter::with_capacity(WRITE_BUFFER, file);
    let total = layout.expert_bytes_total();
    let zeros = vec![0u8; align as usize];
    let mut records = Vec::with_capacity(layout.layers.len() * layout.n_expert);
    let (mut offset, mut done) = (0u64, 0u64);
    for entry in &layout.layers {
        for expert in 0..layout.n_expert {
            // Expert e of a stacked tensor is its e-th contiguous slice: a byte copy, never requantised.
            let parts = layout
                .expert_bytes(gguf, entry.layer, expert)
                .ok_or_else(|| StoreError::Model {
                    path: gguf.path().to_path_buf(),
                    what: format!("layer {}'s expert tensors are shorter than their shapes", entry.layer),
                })?;
            for part in parts {
                w.write_all(part).map_err(io)?;
            }
            let length = entry.record_bytes();
            let pad = length.next_multiple_of(align) - length;
            w.write_all(&zeros[..pad as usize]).map_err(io)?;
            records.push(RecordEntry {
                layer: entry.layer,
                expert,
                offset,
                length,
                blake3: blake3::Hash::from_bytes(titan_layout::digest_of(parts))
                    .to_hex()
                    .to_string(),
            });
            offset += length + pad;
            done += length;
            progress(done, total);
        }
    }
    let file = w.into_inner().map_err(|e| io(e.into_error()))?;
    file.sync_all().map_err(io)?;

    let manifest = Manifest::new(gguf, layout, align, records)?;
    let man_path = dir.join(MANIFEST_FILE);
    let json = manifest.to_json().map_err(|e| StoreError::io(&man_path)(e.into()))?;
    let mut f = File::create(&man_path).map_err(StoreError::io(&man_path))?;
    f.write_all(&json)
        .and_then(|()| f.sync_all())
        .map_err(StoreError::io(&man_path))?;
    sync_dir(dir)?;
    Ok(manifest)
}

/// Rename the finished `partial` directory to `out`, replacing an old store there (callers checked `force`).
fn publish(partial: &Path, out: &Path) -> Result<(), StoreError> {
    // rename(2) cannot replace a non-empty directory: move the old store aside first, then drop it.
    let old = sibling(out, &format!("old-{}", std::process::id()));
    let had_old = out.exists();
    if had_old {
        fs::rename(out, &old).map_err(StoreError::io(out))?;
    }
    fs::rename(partial, out).map_err(StoreError::io(out))?;
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        sync_dir(parent)?;
    }
    if had_old {
        fs::remove_dir_all(&old).map_err(StoreError::io(&old))?;
    }
    Ok(())
}

/// `<out>.<suffix>` beside `out`.
pub(crate) fn sibling(out: &Path, suffix: &str) -> PathBuf {
    let mut name = out.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{suffix}"));
    out.with_file_name(name)
}

/// Remove `<out>.partial-<pid>` directories (or index files) left by conversions that crashed (their process is gone), so
/// an interrupted multi-gigabyte conversion does not keep its disk space forever. A directory whose pid is
/// alive (a conversion running now, or a reused pid) is left alone.
pub(crate) fn remove_stale_partials(out: &Path) {
    let (Some(name), Some(parent)) = (out.file_name(), out.parent()) else {
        return;
    };
    let prefix = format!("{}.partial-", name.to_string_lossy());
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(pid) = file_name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|p| p.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        // SAFETY: kill with signal 0 sends nothing; it only asks whether the process exists.
        let gone =
            unsafe { libc::kill(pid, 0) } == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone {
            // A store's partial is a directory, an index's a file.
            let _ = fs::remove_dir_all(entry.path()).or_else(|_| fs::remove_file(entry.path()));
        }
    }
}

/// fsync a directory so the names created in it survive a crash.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(StoreError::io(dir))
}

/// Whether `dir` is named like a conversion in progress (or one that crashed).
pub(crate) fn is_partial(dir: &Path) -> bool {
    dir.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.contains(".partial-"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{gguf_slice, test_dir, write_model, Spec};
    use crate::{Store, EXPERTS_FILE};

    #[test]
    fn records_are_aligned_byte_copies_of_the_gguf_slices() {
        let dir = test_dir();
        for (i, spec) in [Spec::q4_k_m(), Spec::mixed()].iter().enumerate() {
            let gguf = write_model(dir.path(), &format!("m{i}.gguf"), spec);
            for align in [512u64, 4096, 65536] {
                let out = dir.path().join(format!("m{i}-{align}.titan"));
                let mut calls = Vec::new();
                let opts = ConvertOptions {
                    alignment: align,
                    force: false,
                };
                let m = convert(&gguf, &out, &opts, &mut |d, t| calls.push((d, t))).unwrap();
                assert_eq!(m.n_layer, spec.n_layer);
                assert_eq!(m.n_expert, spec.n_expert);
                assert_eq!(m.layers.len(), spec.n_layer - spec.dense.len());
                assert_eq!(m.records.len(), m.layers.len() * spec.n_expert);
                assert_eq!(m.architecture.as_deref(), Some("qwen3moe"));
                let total = calls.last().unwrap().1;
                assert_eq!(calls.last().unwrap().0, total, "progress ends at the total");
                assert!(calls.windows(2).all(|w| w[0].0 < w[1].0));

                let bin = std::fs::read(out.join(EXPERTS_FILE)).unwrap();
                assert_eq!(bin.len() as u64 % align, 0);
                for r in &m.records {
                    assert_eq!(r.offset % align, 0, "record ({}, {}) is aligned", r.layer, r.expert);
                    let rec = &bin[r.offset as usize..][..r.length as usize];
                    let want = [
                        gguf_slice(&gguf, r.layer, r.expert, "gate"),
                        gguf_slice(&gguf, r.layer, r.expert, "up"),
                        gguf_slice(&gguf, r.layer, r.expert, "down"),
                    ]
                    .concat();
                    assert!(
                        rec == want.as_slice(),
                        "record ({}, {}) is the GGUF bytes",
                        r.layer,
                        r.expert
                    );
                    assert_eq!(blake3::hash(rec).to_hex().as_str(), r.blake3);
                    let pad_end = r.offset + r.length.next_multiple_of(align);
                    assert!(bin[(r.offset + r.length) as usize..pad_end as usize]
                        .iter()
                        .all(|&b| b == 0));
                }
                // Types differ per layer and per matrix, as in Q4_K_M files.
                let l = &m.layers[0];
                assert_eq!(
                    (l.gate.ty.as_str(), l.down.ty.as_str()),
                    (spec.types[0][0].name(), spec.types[0][2].name())
                );
                assert_eq!(
                    (l.gate.rows, l.gate.cols, l.down.rows, l.down.cols),
                    (spec.n_ff, spec.n_embd, spec.n_embd, spec.n_ff)
                );
            }
        }
    }

    #[test]
    fn existing_store_needs_force_and_bad_options_are_refused() {
        let dir = test_dir();
        let gguf = write_model(dir.path(), "m.gguf", &Spec::mixed());
        let out = dir.path().join("m.titan");
        let opts = ConvertOptions::default();
        convert(&gguf, &out, &opts, &mut |_, _| {}).unwrap();
        let err = convert(&gguf, &out, &opts, &mut |_, _| {}).unwrap_err();
        assert!(matches!(err, StoreError::Exists { .. }), "{err}");
        assert!(err.to_string().contains("--force"), "{err}");

        // With force, a store made from another model is replaced, and no temporary directory is left.
        let other = write_model(
            dir.path(),
            "other.gguf",
            &Spec {
                seed: 9,
                ..Spec::mixed()
            },
        );
        convert(
            &other,
            &out,
            &ConvertOptions {
                force: true,
                ..opts.clone()
            },
            &mut |_, _| {},
        )
        .unwrap();
        Store::open(&out, &other).unwrap();
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            !names.iter().any(|n| n.contains(".partial-") || n.contains(".old-")),
            "{names:?}"
        );

        for align in [0, 256, 1000, 3 << 12] {
            let err = convert(
                &gguf,
                &dir.path().join("a.titan"),
                &ConvertOptions {
                    alignment: align,
                    force: false,
                },
                &mut |_, _| {},
            );
            assert!(matches!(err, Err(StoreError::Alignment(a)) if a == align));
        }
    }

    #[test]
    fn a_dense_model_is_refused() {
        let dir = test_dir();
        let gguf = write_model(
            dir.path(),
            "dense.gguf",
            &Spec {
                dense: vec![0, 1, 2],
                ..Spec::q4_k_m()
            },
        );
        let out = dir.path().join("dense.titan");
        let err = convert(&gguf, &out, &ConvertOptions::default(), &mut |_, _| {}).unwrap_err();
        assert!(matches!(err, StoreError::NoExperts(_)), "{err}");
        assert!(err.to_string().contains("dense.gguf: no expert tensors"), "{err}");
        assert!(!out.exists());
    }

    #[test]
    fn an_interrupted_conversion_is_not_a_store() {
        let dir = test_dir();
        let gguf = write_model(dir.path(), "m.gguf", &Spec::mixed());
        let out = dir.path().join("m.titan");
        convert(&gguf, &out, &ConvertOptions::default(), &mut |_, _| {}).unwrap();

        // A crash after the manifest was written but before the rename: a complete-looking `.partial-` dir.
        let partial = dir.path().join("m.titan.partial-4242");
        std::fs::rename(&out, &partial).unwrap();
        let err = Store::open(&partial, &gguf).err().unwrap();
        assert!(matches!(err, StoreError::Unfinished { .. }), "{err}");
        assert!(err.to_string().contains("unfinished conversion"), "{err}");
        // A crash before the manifest: whatever the directory is called, no manifest means no store.
        let renamed = dir.path().join("half.titan");
        std::fs::rename(&partial, &renamed).unwrap();
        std::fs::remove_file(renamed.join(crate::MANIFEST_FILE)).unwrap();
        let err = Store::open(&renamed, &gguf).err().unwrap();
        assert!(matches!(err, StoreError::ManifestMissing { .. }), "{err}");
        assert!(
            err.to_string().contains("half.titan/manifest.json cannot be read"),
            "{err}"
        );
    }

    #[test]
    fn stale_partials_of_dead_processes_are_cleaned_up() {
        let dir = test_dir();
        let gguf = write_model(dir.path(), "m.gguf", &Spec::mixed());
        let out = dir.path().join("m.titan");
        // pid_max on Linux is at most 2^22, so this pid cannot be running; our own pid is.
        let dead = dir.path().join("m.titan.partial-99999999");
        let alive = dir.path().join(format!("m.titan.partial-{}", std::process::id()));
        std::fs::create_dir(&dead).unwrap();
        std::fs::create_dir(&alive).unwrap();
        std::fs::write(alive.join("junk"), b"x").unwrap();
        convert(&gguf, &out, &ConvertOptions::default(), &mut |_, _| {}).unwrap();
        assert!(!dead.exists());
        // Our own pid's partial directory was the one the conversion used, then renamed.
        assert!(!alive.exists());
        Store::open(&out, &gguf).unwrap();
    }
}
