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
    #[default]
    Copy,
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

/// The store beside `model` that streaming uses when none is named: the copy if there is one (the
/// default layout, and one read per expert), else the in-place index.
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
        "no expert store beside {m} (looked for {} and {}): create one with `titan convert {m}` (a copy \
         of the experts) or `titan convert {m} --layout in-place` (an index, no copy)",
        copy.display(),
        index.display()
    )
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

/// Memory the kernel says is available for new allocations without swapping.
pub fn mem_available() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

impl StreamArgs {
    /// Load options for a model at `model`; resident unless a budget or a store was given.
    pub fn load_options(&self, model: &Path) -> Result<LoadOptions> {
        if self.expert_budget.is_none() && self.store.is_none() {
            return Ok(LoadOptions::default());
        }
        let store = match &self.store {
            Some(s) if !s.is_file() && !s.join(titan_store::MANIFEST_FILE).exists() => {
                bail!("{}: no expert store there (create it with `titan convert {}`)", s.display(), model.display())
            }
            Some(s) => s.clone(),
            None => find_store(model)?,
        };
        let budget_bytes = match self.expert_budget.as_deref() {
            None | Some("auto") => {
                // Free memory less the dense weights (copied into memory at load) and 1 GiB of headroom
                // for the KV cache, activations and the rest of the system.
                let (dense, _) = titan_engine::weights::dense_and_expert_bytes(&titan_gguf::GgufFile::open(model)?);
                mem_available().context("cannot read MemAvailable from /proc/meminfo; give --expert-budget a size")?.saturating_sub(dense + (1 << 30))
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
    use super::parse_size;

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
