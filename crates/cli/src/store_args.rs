//! Command-line options for streaming experts from an expert store, and the `auto` budget.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use titan_engine::{LoadOptions, StreamOptions};
use titan_store::{Layout, Policy, Profile, Store};

#[derive(Args, Clone, Default)]
pub struct StreamArgs {
    /// Keep at most this many bytes of experts in memory and stream the rest from the expert store
    /// (e.g. 4GiB, 512MiB, or `auto` to size it from free memory). Dense weights stay resident.
    #[arg(long = "expert-budget")]
    pub expert_budget: Option<String>,
    /// The expert store: a store directory or an in-place index, written by `titan convert` (default:
    /// MODEL.titan beside the model, else MODEL.titan-index).
    #[arg(long)]
    pub store: Option<PathBuf>,
    /// Read experts with O_DIRECT, bypassing the page cache.
    #[arg(long = "direct-io")]
    pub direct_io: bool,
    /// Skip the BLAKE3 check of each expert record as it is read.
    #[arg(long = "no-verify")]
    pub no_verify: bool,
    /// Which resident expert to evict first.
    #[arg(long = "cache-policy", value_enum, default_value = "lru")]
    pub policy: PolicyArg,
    /// Pin the hottest experts of a routing profile (from `titan profile`), up to half the budget.
    #[arg(long)]
    pub pin: Option<PathBuf>,
    /// Read the next layer's likely experts ahead of time.
    #[arg(long)]
    pub prefetch: bool,
    /// Load every weight into memory even when the model does not fit (by default such a model streams
    /// its experts, from an in-place index made beside it on first use).
    #[arg(long, conflicts_with_all = ["expert_budget", "store"])]
    pub resident: bool,
}

#[derive(ValueEnum, Clone, Copy, Default)]
pub enum PolicyArg {
    #[default]
    Lru,
    Lfu,
}

/// `titan convert --layout`.
#[derive(ValueEnum, Clone, Copy, Default)]
pub enum LayoutArg {
    Copy,
    #[default]
    InPlace,
}

impl From<LayoutArg> for Layout {
    fn from(a: LayoutArg) -> Layout {
        match a {
            LayoutArg::Copy => Layout::Copy,
            LayoutArg::InPlace => Layout::InPlace,
        }
    }
}

/// Where `titan convert` puts a model's store: `MODEL.gguf` -> `MODEL.titan` (a directory) for a copy,
/// `MODEL.titan-index` (a file) for an in-place index.
pub fn default_store(model: &Path, layout: Layout) -> PathBuf {
    match layout {
        Layout::Copy => model.with_extension("titan"),
        Layout::InPlace => model.with_extension("titan-index"),
    }
}

/// The store beside `model` that streaming uses when none is named: a copy if one was made (asked for
/// with `--layout copy`, so wanted), else the in-place index.
fn find_store(model: &Path) -> Result<PathBuf> {
    let (copy, index) = (default_store(model, Layout::Copy), default_store(model, Layout::InPlace));
    if copy.join(titan_store::MANIFEST_FILE).exists() {
        return Ok(copy);
    }
    if index.is_file() {
        return Ok(index);
    }
    let m = model.display();
    bail!(
        "no expert store beside {m} (looked for {} and {}): create one with `titan convert {m}` (an index, \
         no copy) or `titan convert {m} --layout copy` (a copy of the experts)",
        copy.display(),
        index.display()
    )
}

/// Whether `model`'s weights fit in the memory available with headroom to spare; says so when not.
fn fits(model: &Path) -> Result<bool> {
    let (dense, experts) = titan_engine::weights::dense_and_expert_bytes(&titan_gguf::GgufFile::open(model)?);
    let Some(available) = mem_available() else { return Ok(true) };
    if dense + experts + HEADROOM <= available {
        return Ok(true);
    }
    let h = crate::human;
    if dense + HEADROOM > available {
        bail!(
            "{}: its dense weights alone ({}) and 1 GiB of headroom do not fit in the {} of memory available, so not even its experts can stream (--resident tries anyway)",
            model.display(),
            h(dense),
            h(available)
        );
    }
    eprintln!(
        "{}: {} of weights do not fit in the {} of memory available: its experts ({}) stream from disk through a \
         budget of {} (--resident loads everything anyway)",
        model.display(),
        h(dense + experts),
        h(available),
        h(experts),
        h(available - dense - HEADROOM)
    );
    Ok(false)
}

/// The in-place index beside `model`, written now (with a progress bar): streaming without a second copy
/// of the experts.
fn index_beside(model: &Path) -> Result<PathBuf> {
    let out = default_store(model, Layout::InPlace);
    eprintln!("indexing the experts of {} into {} (once; no copy of them is made)", model.display(), out.display());
    let bar = crate::progress_bar(0, "indexing");
    let gguf = titan_gguf::GgufFile::open(model)?;
    titan_store::write_index(&gguf, &out, false, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })
    .with_context(|| format!("writing the expert index {} (give --store a writable place for one made with `titan convert --layout in-place -o`)", out.display()))?;
    bar.finish_and_clear();
    Ok(out)
}

/// "4GiB", "512MiB", "2.5GB", "1000000" -> bytes.
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().with_context(|| format!("{s:?} is not a size (examples: 4GiB, 512MiB, auto)"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mib" => 1024.0 * 1024.0,
        "g" | "gb" => 1e9,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tb" => 1e12,
        "tib" => 1024f64.powi(4),
        u => bail!("unknown size unit {u:?} in {s:?} (use B, KiB, MiB, GiB, KB, MB, GB)"),
    };
    Ok((n * mult) as u64)
}

/// Memory this process can still take without swapping or being killed: the kernel's MemAvailable,
/// less where a memory cgroup above the process limits it to less; `TITAN_MEMORY_AVAILABLE` (a size)
/// overrides both, to plan as if only that much were free.
pub fn mem_available() -> Option<u64> {
    if let Ok(v) = std::env::var("TITAN_MEMORY_AVAILABLE") {
        return parse_size(&v).ok();
    }
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let host = line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024;
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    Some(cgroup_headroom(Path::new("/sys/fs/cgroup"), &own).map_or(host, |c| c.min(host)))
}

/// The least headroom over this process's memory cgroups and their ancestors, if any of them sets a
/// limit (a container, `systemd-run -p MemoryMax=`, a cgroup made by hand): the limit less the usage,
/// where usage leaves out the inactive page cache, which the kernel drops before it would kill anyone.
/// Both hierarchies: v2 (`memory.max`, `memory.current`) and v1's memory controller
/// (`memory.limit_in_bytes`, `memory.usage_in_bytes`), still the default on older hosts. `own` is the
/// text of /proc/self/cgroup; `sys` where the hierarchies are mounted.
fn cgroup_headroom(sys: &Path, own: &str) -> Option<u64> {
    let mut least: Option<u64> = None;
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else { continue };
        let (root, limit, usage, inactive) = match controllers {
            "" => (sys.to_path_buf(), "memory.max", "memory.current", "inactive_file"),
            c if c.split(',').any(|c| c == "memory") => (sys.join("memory"), "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
            _ => continue,
        };
        let mut dir = root.join(path.trim().trim_start_matches('/'));
        loop {
            let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok().and_then(|v| v.trim().parse::<u64>().ok());
            if let (Some(max), Some(current)) = (read(limit), read(usage)) {
                let stat = std::fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
                let cache = stat.lines().find_map(|l| l.strip_prefix(inactive)?.strip_prefix(' ')?.trim().parse::<u64>().ok()).unwrap_or(0);
                let left = max.saturating_sub(current.saturating_sub(cache));
                least = Some(least.map_or(left, |l| l.min(left)));
            }
            if dir == root || !dir.pop() {
                break;
            }
        }
    }
    least
}

/// Memory kept free beside the weights for the KV cache, the activations and the rest of the system.
const HEADROOM: u64 = 1 << 30;

impl StreamArgs {
    /// Load options for a model at `model`: streamed when a budget or a store is given, or when the
    /// model's weights do not fit in the memory available (unless `--resident`); else resident.
    pub fn load_options(&self, model: &Path) -> Result<LoadOptions> {
        let automatic = self.expert_budget.is_none() && self.store.is_none();
        if automatic && (self.resident || fits(model)?) {
            return Ok(LoadOptions::default());
        }
        let store = match &self.store {
            Some(s) if !s.is_file() && !s.join(titan_store::MANIFEST_FILE).exists() => {
                bail!("{}: no expert store there (create it with `titan convert {}`)", s.display(), model.display())
            }
            Some(s) => s.clone(),
            None if automatic => find_store(model).or_else(|_| index_beside(model))?,
            None => find_store(model)?,
        };
        let budget_bytes = match self.expert_budget.as_deref() {
            None | Some("auto") => {
                // Free memory less the dense weights (copied into memory at load) and the headroom.
                let (dense, _) = titan_engine::weights::dense_and_expert_bytes(&titan_gguf::GgufFile::open(model)?);
                mem_available().context("cannot read MemAvailable from /proc/meminfo; give --expert-budget a size")?.saturating_sub(dense + HEADROOM)
            }
            Some(s) => parse_size(s)?,
        };
        let pinned = match &self.pin {
            None => Vec::new(),
            Some(p) => {
                let profile = Profile::load(p)?;
                let store = Store::open(&store, &titan_gguf::GgufFile::open(model)?)?;
                profile.hottest(budget_bytes / 2, |l, e| store.record_bytes(l, e))
            }
        };
        Ok(LoadOptions {
            stream: Some(StreamOptions {
                store,
                budget_bytes,
                policy: match self.policy {
                    PolicyArg::Lru => Policy::Lru,
                    PolicyArg::Lfu => Policy::Lfu,
                },
                direct_io: self.direct_io,
                verify_digests: !self.no_verify,
                pinned,
                prefetch: self.prefetch,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{cgroup_headroom, parse_size};
    use std::path::Path;

    fn write(dir: &Path, files: &[(&str, &str)]) {
        std::fs::create_dir_all(dir).unwrap();
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap();
        }
    }

    /// Real files laid out as the kernel mounts them: the least headroom over the process's cgroup and
    /// its ancestors wins, inactive page cache counts as free, "max" means no limit.
    #[test]
    fn cgroup_headroom_of_either_hierarchy() {
        let t = tempfile::tempdir().unwrap();
        let sys = t.path();
        // v2: a 6 GiB limit two levels up, 1 GiB used of which 256 MiB is inactive page cache; no limit below.
        write(&sys.join("box"), &[("memory.max", "6442450944\n"), ("memory.current", "1073741824\n"), ("memory.stat", "anon 1\ninactive_file 268435456\nactive_file 5\n")]);
        write(&sys.join("box/job"), &[("memory.max", "max\n"), ("memory.current", "5\n")]);
        assert_eq!(cgroup_headroom(sys, "0::/box/job\n"), Some((6 << 30) - (1 << 30) + (256 << 20)));
        assert_eq!(cgroup_headroom(sys, "0::/elsewhere\n"), None);
        // v1's memory controller, beside other controllers; its root reports an unlimited limit.
        write(&sys.join("memory"), &[("memory.limit_in_bytes", "9223372036854771712\n"), ("memory.usage_in_bytes", "1000\n")]);
        write(&sys.join("memory/bench"), &[("memory.limit_in_bytes", "10737418240\n"), ("memory.usage_in_bytes", "2147483648\n"), ("memory.stat", "cache 5\ntotal_inactive_file 1073741824\n")]);
        let own = "5:cpu,cpuacct:/\n4:memory:/bench\n0::/\n";
        assert_eq!(cgroup_headroom(sys, own), Some((10 << 30) - (1 << 30)));
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4GiB").unwrap(), 4 << 30);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("1.5GB").unwrap(), 1_500_000_000);
        assert_eq!(parse_size("1234").unwrap(), 1234);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("4 parsecs").is_err());
    }
}
