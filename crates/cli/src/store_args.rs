//! Command-line options for streaming experts from an expert store, and the `auto` budget.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use titan_engine::{Config, LoadOptions, ReadMode, StreamOptions};
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
    /// Read experts with O_DIRECT, bypassing the page cache (the default with an automatic budget, where
    /// the filesystem allows it).
    #[arg(long = "direct-io")]
    pub direct_io: bool,
    /// Read experts through the page cache (the default with a budget of a given size, where memory
    /// outside it can cache the file).
    #[arg(long = "buffered-io", conflicts_with = "direct_io")]
    pub buffered_io: bool,
    /// Skip the BLAKE3 check of each expert record as it is read.
    #[arg(long = "no-verify")]
    pub no_verify: bool,
    /// Which resident expert to evict first.
    #[arg(long = "cache-policy", value_enum, default_value = "lru")]
    pub policy: PolicyArg,
    /// Pin the hottest experts of a routing profile (from `titan profile`), up to half the budget.
    #[arg(long)]
    pub pin: Option<PathBuf>,
    /// Do not read the next layer's likely experts ahead of time (by default they are read while this
    /// layer computes: 12–24% faster decode on the Zen 4 EPYC's disk, a wash on a slower one).
    #[arg(long = "no-prefetch")]
    pub no_prefetch: bool,
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
    let (copy, index) = (
        default_store(model, Layout::Copy),
        default_store(model, Layout::InPlace),
    );
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

/// The KV caches a command will hold: the memory plan leaves room for them beside the weights.
#[derive(Clone, Copy, Debug)]
pub struct KvPlan {
    /// Sequences held at once (0 on a worker, which holds none).
    pub sequences: usize,
    /// Positions each one is sized for (`--ctx-size`; `None`: its default, [`default_ctx`]).
    pub ctx: Option<usize>,
    /// Positions a run can use at most (its prompt and generated tokens), where fewer than `ctx`.
    pub used: Option<usize>,
    /// Whether a context past the model's training context is allowed (`--allow-long-context`). Without,
    /// the plan stops there: a longer one is refused after loading, with that reason rather than memory.
    pub past_training: bool,
}

impl KvPlan {
    pub const NONE: KvPlan = KvPlan {
        sequences: 0,
        ctx: Some(0),
        used: None,
        past_training: false,
    };

    /// One sequence of `positions`.
    pub fn positions(positions: usize) -> KvPlan {
        KvPlan {
            sequences: 1,
            ctx: Some(positions),
            used: None,
            past_training: false,
        }
    }

    fn positions_of(&self, c: &Config) -> usize {
        let most = if self.past_training { usize::MAX } else { c.n_ctx_train };
        self.ctx
            .unwrap_or_else(|| default_ctx(c))
            .min(self.used.unwrap_or(usize::MAX))
            .min(most)
    }

    fn bytes(&self, c: &Config) -> u64 {
        u64::try_from(self.sequences as u128 * c.kv_bytes(self.positions_of(c))).unwrap_or(u64::MAX)
    }
}

/// `--ctx-size`'s default: the model's training context, at most 4096 positions.
pub fn default_ctx(c: &Config) -> usize {
    c.n_ctx_train.min(4096)
}

/// Memory kept free beside the weights and the KV caches, for activations, buffers and the allocator.
/// Measured: Qwen3-30B-A3B streamed through a 6 GiB cgroup with a 512-token prompt peaked 0.13 GiB above its
/// weights, budget and KV cache (the README's "memory plan").
const MARGIN: u64 = 512 << 20;

/// How the memory available is shared out: dense weights (copied into memory at load), the KV caches
/// the command will hold and a margin; the experts get the rest when they do not all fit.
struct MemoryPlan {
    available: u64,
    dense: u64,
    experts: u64,
    kv: u64,
    positions: usize,
    sequences: usize,
}

impl MemoryPlan {
    /// The plan for `model` in the memory available now, or `None` when that cannot be read.
    fn of(model: &Path, kv: KvPlan) -> Result<Option<MemoryPlan>> {
        let gguf = titan_gguf::GgufFile::open(model)?;
        Ok(mem_available().map(|available| MemoryPlan::new(&gguf, kv, available)))
    }

    fn new(gguf: &titan_gguf::GgufFile, kv: KvPlan, available: u64) -> MemoryPlan {
        let (dense, experts) = titan_engine::weights::dense_and_expert_bytes(gguf);
        // A file whose hyper-parameters do not parse fails to load just after, with the reason; until
        // then it plans no KV cache.
        let config = Config::from_gguf(gguf).ok();
        MemoryPlan {
            available,
            dense,
            experts,
            kv: config.as_ref().map_or(0, |c| kv.bytes(c)),
            positions: config.as_ref().map_or(0, |c| kv.positions_of(c)),
            sequences: kv.sequences,
        }
    }

    fn reserved(&self) -> u64 {
        self.dense.saturating_add(self.kv).saturating_add(MARGIN)
    }

    fn fits(&self) -> bool {
        self.reserved().saturating_add(self.experts) <= self.available
    }

    fn expert_budget(&self) -> u64 {
        self.available.saturating_sub(self.reserved())
    }

    /// "the dense weights (…), 2 × 4096 positions of KV cache (…) and 512.00 MiB for the rest".
    fn reserved_text(&self) -> String {
        let h = crate::human;
        let kv = match self.sequences {
            0 => String::new(),
            1 => format!(", {} positions of KV cache ({})", self.positions, h(self.kv)),
            n => format!(", {n} × {} positions of KV cache ({})", self.positions, h(self.kv)),
        };
        format!(
            "the dense weights ({}){kv} and {} for the rest",
            h(self.dense),
            h(MARGIN)
        )
    }
}

/// Whether `model`'s weights fit in the memory available beside what else the command holds (`plan`;
/// none when the memory available is unknown); says so when not.
fn fits(model: &Path, plan: Option<&MemoryPlan>) -> Result<bool> {
    let Some(plan) = plan else { return Ok(true) };
    if plan.fits() {
        return Ok(true);
    }
    let h = crate::human;
    if plan.reserved() > plan.available {
        let less = if plan.kv > 0 {
            "; a smaller --ctx-size (or --parallel) needs less"
        } else {
            ""
        };
        bail!(
            "{}: {} do not fit in the {} of memory available, so not even its experts can stream (--resident tries anyway{less})",
            model.display(),
            plan.reserved_text(),
            h(plan.available)
        );
    }
    eprintln!(
        "{}: {} of weights do not fit in the {} of memory available: its experts ({}) stream from disk through a \
         budget of {} (what is left beside {}; --resident loads everything anyway)",
        model.display(),
        h(plan.dense + plan.experts),
        h(plan.available),
        h(plan.experts),
        h(plan.expert_budget()),
        plan.reserved_text()
    );
    Ok(false)
}

/// The in-place index beside `model`, written now (with a progress bar): streaming without a second copy
/// of the experts.
fn index_beside(model: &Path) -> Result<PathBuf> {
    let out = default_store(model, Layout::InPlace);
    eprintln!(
        "indexing the experts of {} into {} (once; no copy of them is made)",
        model.display(),
        out.display()
    );
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
    let n: f64 = num
        .parse()
        .with_context(|| format!("{s:?} is not a size (examples: 4GiB, 512MiB, auto)"))?;
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
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let (root, limit, usage, inactive) = match controllers {
            "" => (sys.to_path_buf(), "memory.max", "memory.current", "inactive_file"),
            c if c.split(',').any(|c| c == "memory") => (
                sys.join("memory"),
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
                "total_inactive_file",
            ),
            _ => continue,
        };
        let mut dir = root.join(path.trim().trim_start_matches('/'));
        loop {
            let read = |f: &str| {
                std::fs::read_to_string(dir.join(f))
                    .ok()
                    .and_then(|v| v.trim().parse::<u64>().ok())
            };
            if let (Some(max), Some(current)) = (read(limit), read(usage)) {
                let stat = std::fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
                let cache = stat
                    .lines()
                    .find_map(|l| l.strip_prefix(inactive)?.strip_prefix(' ')?.trim().parse::<u64>().ok())
                    .unwrap_or(0);
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

impl StreamArgs {
    /// Load options for a model at `model`: streamed when a budget or a store is given, or when the
    /// model's weights do not fit in the memory available beside the KV caches of `kv` (unless
    /// `--resident`); else resident.
    pub fn load_options(&self, model: &Path, kv: KvPlan) -> Result<LoadOptions> {
        let automatic = self.expert_budget.is_none() && self.store.is_none();
        if automatic && self.resident {
            return Ok(LoadOptions::default());
        }
        // One plan decides both whether the model fits and the automatic budget.
        let plan = match self.expert_budget.as_deref() {
            None | Some("auto") => MemoryPlan::of(model, kv)?,
            Some(_) => None,
        };
        if automatic && fits(model, plan.as_ref())? {
            return Ok(LoadOptions::default());
        }
        let store = match &self.store {
            Some(s) if !s.is_file() && !s.join(titan_store::MANIFEST_FILE).exists() => {
                bail!(
                    "{}: no expert store there (create it with `titan convert {}`)",
                    s.display(),
                    model.display()
                )
            }
            Some(s) => s.clone(),
            None if automatic => find_store(model).or_else(|_| index_beside(model))?,
            None => find_store(model)?,
        };
        let budget_bytes = match self.expert_budget.as_deref() {
            None | Some("auto") => plan
                .context("cannot read MemAvailable from /proc/meminfo; give --expert-budget a size")?
                .expert_budget(),
            Some(s) => parse_size(s)?,
        };
        // An automatic budget takes the memory there is: a page cache beside it would be filled and
        // reclaimed again for every read, which on two cores cost more CPU than the digests (Qwen3-30B-A3B
        // in 6 GiB: 37 s of kernel time per 96 tokens buffered, 18 s direct; 1.60 -> 2.49 tok/s steady).
        let io = if self.direct_io {
            ReadMode::Direct
        } else if self.buffered_io || !matches!(self.expert_budget.as_deref(), None | Some("auto")) {
            ReadMode::Buffered
        } else {
            ReadMode::DirectIfSupported
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
                io,
                verify_digests: !self.no_verify,
                pinned,
                prefetch: !self.no_prefetch,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{cgroup_headroom, parse_size, KvPlan, MemoryPlan, MARGIN};
    use std::path::Path;
    use titan_engine::Config;

    /// The automatic budget is what the memory available leaves beside the dense weights, every sequence's
    /// KV cache at the positions it can use, and the margin; a model fits when its experts do too.
    #[test]
    fn the_expert_budget_leaves_room_for_the_kv_caches() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3moe/q8_0.gguf");
        let gguf = titan_gguf::GgufFile::open(&path).unwrap();
        let config = Config::from_gguf(&gguf).unwrap();
        let (dense, experts) = titan_engine::weights::dense_and_expert_bytes(&gguf);
        let kv = |n: usize| u64::try_from(config.kv_bytes(n)).unwrap();
        assert!(kv(1) > 0);
        let available = dense + experts + MARGIN + 4 * kv(100);

        // Four slots of 100 positions fill the memory exactly: the experts fit, with not a byte to spare.
        let slots = KvPlan {
            sequences: 4,
            ctx: Some(100),
            used: None,
            past_training: false,
        };
        let plan = MemoryPlan::new(&gguf, slots, available);
        assert!(plan.fits());
        assert_eq!(plan.expert_budget(), experts);
        assert!(!MemoryPlan::new(&gguf, slots, available - 1).fits());

        // A run that can use only 60 of its 100 positions plans for 60.
        let run = MemoryPlan::new(
            &gguf,
            KvPlan {
                sequences: 1,
                ctx: Some(100),
                used: Some(60),
                past_training: false,
            },
            available,
        );
        assert_eq!(run.expert_budget(), experts + 4 * kv(100) - kv(60));
        // Without --ctx-size, the default context: the training context, at most 4096.
        let default = MemoryPlan::new(
            &gguf,
            KvPlan {
                sequences: 2,
                ctx: None,
                used: None,
                past_training: false,
            },
            available,
        );
        assert_eq!(default.kv, 2 * kv(config.n_ctx_train.min(4096)));
        // A context past the training one is planned only where allowed; elsewhere it is refused later.
        let long = |past_training| {
            MemoryPlan::new(
                &gguf,
                KvPlan {
                    sequences: 1,
                    ctx: Some(1 << 30),
                    used: None,
                    past_training,
                },
                available,
            )
            .kv
        };
        assert_eq!(long(false), kv(config.n_ctx_train));
        assert_eq!(long(true), kv(1 << 30));
        // A worker holds no KV cache; memory below the dense weights and margin leaves no budget at all.
        assert_eq!(
            MemoryPlan::new(&gguf, KvPlan::NONE, available).expert_budget(),
            experts + 4 * kv(100)
        );
        assert_eq!(MemoryPlan::new(&gguf, KvPlan::NONE, dense).expert_budget(), 0);
        let text = plan.reserved_text();
        assert!(
            text.contains("4 × 100 positions of KV cache") && text.contains("512.00 MiB for the rest"),
            "{text}"
        );
    }

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
        write(
            &sys.join("box"),
            &[
                ("memory.max", "6442450944\n"),
                ("memory.current", "1073741824\n"),
                ("memory.stat", "anon 1\ninactive_file 268435456\nactive_file 5\n"),
            ],
        );
        write(
            &sys.join("box/job"),
            &[("memory.max", "max\n"), ("memory.current", "5\n")],
        );
        assert_eq!(
            cgroup_headroom(sys, "0::/box/job\n"),
            Some((6 << 30) - (1 << 30) + (256 << 20))
        );
        assert_eq!(cgroup_headroom(sys, "0::/elsewhere\n"), None);
        // v1's memory controller, beside other controllers; its root reports an unlimited limit.
        write(
            &sys.join("memory"),
            &[
                ("memory.limit_in_bytes", "9223372036854771712\n"),
                ("memory.usage_in_bytes", "1000\n"),
            ],
        );
        write(
            &sys.join("memory/bench"),
            &[
                ("memory.limit_in_bytes", "10737418240\n"),
                ("memory.usage_in_bytes", "2147483648\n"),
                ("memory.stat", "cache 5\ntotal_inactive_file 1073741824\n"),
            ],
        );
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
