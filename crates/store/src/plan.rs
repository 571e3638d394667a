//! Deciding where a model's experts live: all in memory, or streamed from a store through a budget sized
//! from the memory there is — and loading the model so.
//!
//! Memory available is the kernel's MemAvailable, or less where a memory cgroup above the process limits
//! it. The plan sets aside the dense weights (copied into memory at load), the KV caches the command will
//! hold and a margin; a model whose experts fit beside those loads resident, any other streams its experts
//! through what is left, from a store beside it (an in-place index made on first use when there is none).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use titan_engine::experts::Experts;
use titan_engine::profile::Profile;
use titan_engine::weights::ExpertExtras;
use titan_engine::{Config, Model};
use titan_gguf::GgufFile;

use crate::units::{human_bytes, parse_size};
use crate::{write_index, Budget, CacheOptions, ExpertCache, Layout, Policy, Store, StoreError, StoreOptions};
use crate::{StreamedExperts, MANIFEST_FILE};

/// How a command wants its model's experts (what `--expert-budget`, `--store`, `--resident`… say).
#[derive(Clone, Debug)]
pub struct ExpertChoice {
    /// `None`: stream only when the model does not fit, through the automatic budget.
    pub budget: Option<BudgetChoice>,
    /// The store to stream from (a store directory or an in-place index); `None`: the one beside the model.
    pub store: Option<PathBuf>,
    /// `None`: direct I/O where the filesystem allows it with an automatic budget, the page cache with a
    /// given one.
    pub io: Option<ReadMode>,
    pub verify_digests: bool,
    pub policy: Policy,
    /// A routing profile whose hottest experts stay resident (up to half the budget).
    pub pin: Option<PathBuf>,
    /// Read the next layer's likely experts ahead.
    pub prefetch: bool,
    /// Load every weight into memory even when the model does not fit.
    pub resident: bool,
}

impl Default for ExpertChoice {
    fn default() -> Self {
        ExpertChoice {
            budget: None,
            store: None,
            io: None,
            verify_digests: true,
            policy: Policy::Lru,
            pin: None,
            prefetch: true,
            resident: false,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetChoice {
    /// What the memory available leaves beside the dense weights, the KV caches and the margin.
    Auto,
    Bytes(u64),
}

impl std::str::FromStr for BudgetChoice {
    type Err = String;

    /// `auto`, or a size (`4GiB`) of at least a byte.
    fn from_str(s: &str) -> Result<BudgetChoice, String> {
        match s {
            "auto" => Ok(BudgetChoice::Auto),
            s => match parse_size(s)? {
                0 => Err(format!(
                    "{s:?} is 0 bytes, which holds no expert (a budget below one expert per layer is raised to that)"
                )),
                b => Ok(BudgetChoice::Bytes(b)),
            },
        }
    }
}

/// How expert records are read from the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadMode {
    /// Through the page cache, which keeps what memory outside the budget can hold.
    Buffered,
    /// With O_DIRECT (F_NOCACHE on macOS), an error where the filesystem refuses it.
    Direct,
    /// Direct where the filesystem allows it, else buffered: for a budget that takes the memory there is,
    /// beside which a page cache would only cost a copy per read and the kernel's reclaim.
    DirectIfSupported,
}

/// A decided stream: the store, the budget and how to read.
#[derive(Clone, Debug)]
pub struct StreamPlan {
    pub store: PathBuf,
    pub budget_bytes: u64,
    pub policy: Policy,
    pub io: ReadMode,
    pub verify_digests: bool,
    /// Experts to keep resident for the whole run (the hottest of a routing profile).
    pub pinned: Vec<(usize, usize)>,
    pub prefetch: bool,
}

/// The KV caches a command will hold: the memory plan leaves room for them beside the weights.
#[derive(Clone, Copy, Debug)]
pub struct KvPlan {
    /// Sequences held at once (0 on an expert node, which holds none).
    pub sequences: usize,
    /// Positions each one is sized for (`None`: the default, [`default_ctx`]).
    pub ctx: Option<usize>,
    /// Positions a run can use at most (its prompt and generated tokens), where fewer than `ctx`.
    pub used: Option<usize>,
    /// Whether a context past the model's training context is allowed. Without, the plan stops there: a
    /// longer one is refused after loading, with that reason rather than memory.
    pub past_training: bool,
    /// Whether each sequence drafts with the model's MTP block (`--spec mtp`), whose own KV cache it holds.
    pub mtp: bool,
}

impl KvPlan {
    pub const NONE: KvPlan = KvPlan {
        sequences: 0,
        ctx: Some(0),
        used: None,
        past_training: false,
        mtp: false,
    };

    /// One sequence of `positions`.
    pub fn positions(positions: usize) -> KvPlan {
        KvPlan {
            sequences: 1,
            ctx: Some(positions),
            used: None,
            past_training: false,
            mtp: false,
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
        let n = self.positions_of(c);
        let mtp = if self.mtp { c.mtp_kv_bytes(n) } else { 0 };
        u64::try_from(self.sequences as u128 * (c.kv_bytes(n) + mtp)).unwrap_or(u64::MAX)
    }
}

/// The default context: the model's training context, at most 4096 positions.
pub fn default_ctx(c: &Config) -> usize {
    c.n_ctx_train.min(4096)
}

/// Memory kept free beside the weights and the KV caches, for activations, buffers and the allocator.
/// Measured: Qwen3-30B-A3B streamed through a 6 GiB cgroup with a 512-token prompt peaked 0.13 GiB above its
/// weights, budget and KV cache (docs/streaming.md, "memory plan").
pub const MARGIN: u64 = 512 << 20;

/// How the memory available is shared out: dense weights (copied into memory at load), the KV caches
/// the command will hold and a margin; the experts get the rest when they do not all fit.
#[derive(Clone, Debug)]
pub struct MemoryPlan {
    pub available: u64,
    pub dense: u64,
    pub experts: u64,
    pub kv: u64,
    positions: usize,
    sequences: usize,
}

impl MemoryPlan {
    pub fn new(gguf: &GgufFile, kv: KvPlan, available: u64) -> MemoryPlan {
        let (dense, experts) = titan_layout::dense_and_expert_bytes(gguf);
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

    pub fn reserved(&self) -> u64 {
        self.dense.saturating_add(self.kv).saturating_add(MARGIN)
    }

    /// Whether every weight fits beside the KV caches and the margin.
    pub fn fits(&self) -> bool {
        self.reserved().saturating_add(self.experts) <= self.available
    }

    pub fn expert_budget(&self) -> u64 {
        self.available.saturating_sub(self.reserved())
    }

    /// "the dense weights (…), 2 × 4096 positions of KV cache (…) and 512.00 MiB for the rest".
    pub fn reserved_text(&self) -> String {
        let h = human_bytes;
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

/// Memory this process can still take without swapping or being killed: the kernel's MemAvailable,
/// less where a memory cgroup above the process limits it to less; `TITAN_MEMORY_AVAILABLE` (a size)
/// overrides both, to plan as if only that much were free. `None` where none of these can be read.
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

/// Where `titan convert` puts a model's store: `MODEL.gguf` -> `MODEL.titan` (a directory) for a copy,
/// `MODEL.titan-index` (a file) for an in-place index.
pub fn default_store(model: &Path, layout: Layout) -> PathBuf {
    match layout {
        Layout::Copy => model.with_extension("titan"),
        Layout::InPlace => model.with_extension("titan-index"),
    }
}

/// The store beside `model` that streaming uses when none is named: a copy if one was made (asked for,
/// so wanted), else the in-place index.
pub fn find_store(model: &Path) -> Result<PathBuf, StoreError> {
    let (copy, index) = (
        default_store(model, Layout::Copy),
        default_store(model, Layout::InPlace),
    );
    if copy.join(MANIFEST_FILE).exists() {
        return Ok(copy);
    }
    if index.is_file() {
        return Ok(index);
    }
    Err(StoreError::NoStore {
        model: model.to_path_buf(),
        copy,
        index,
    })
}

/// Where `model`'s experts will come from, as `choice` asks given the KV caches of `kv`: resident (`None`)
/// or streamed. Says why on the log when a model streams because it does not fit; makes the in-place
/// index beside the model on first use then (`progress(done, total)` counts bytes hashed).
pub fn decide(
    model: &Path,
    choice: &ExpertChoice,
    kv: KvPlan,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Option<StreamPlan>, StoreError> {
    let automatic = choice.budget.is_none() && choice.store.is_none();
    if automatic && choice.resident {
        return Ok(None);
    }
    // One plan decides both whether the model fits and the automatic budget.
    let plan = match choice.budget {
        None | Some(BudgetChoice::Auto) => {
            let gguf = GgufFile::open(model).map_err(titan_engine::EngineError::from)?;
            mem_available().map(|available| MemoryPlan::new(&gguf, kv, available))
        }
        Some(BudgetChoice::Bytes(_)) => None,
    };
    if automatic && fits(model, plan.as_ref())? {
        return Ok(None);
    }
    // The budget before the store: a budget that cannot be had is the error to fix first, whatever the
    // store lookup would say.
    let budget_bytes = match choice.budget {
        None | Some(BudgetChoice::Auto) => plan.ok_or(StoreError::MemoryUnknown)?.expert_budget(),
        Some(BudgetChoice::Bytes(b)) => b,
    };
    let store = match &choice.store {
        Some(s) if !s.is_file() && !s.join(MANIFEST_FILE).exists() => {
            return Err(StoreError::NotAStore {
                path: s.clone(),
                model: model.to_path_buf(),
            })
        }
        Some(s) => s.clone(),
        None if automatic => match find_store(model) {
            Ok(s) => s,
            Err(_) => index_beside(model, progress)?,
        },
        None => find_store(model)?,
    };
    // An automatic budget takes the memory there is: a page cache beside it would be filled and
    // reclaimed again for every read, which on two cores cost more CPU than the digests (Qwen3-30B-A3B
    // in 6 GiB: 37 s of kernel time per 96 tokens buffered, 18 s direct; 1.60 -> 2.49 tok/s steady).
    let io = choice.io.unwrap_or(match choice.budget {
        Some(BudgetChoice::Bytes(_)) => ReadMode::Buffered,
        None | Some(BudgetChoice::Auto) => ReadMode::DirectIfSupported,
    });
    let pinned = match &choice.pin {
        None => Vec::new(),
        Some(p) => {
            let profile = Profile::load(p)?;
            let gguf = GgufFile::open(model).map_err(titan_engine::EngineError::from)?;
            let store = Store::open(&store, &gguf)?;
            profile.hottest(budget_bytes / 2, |l, e| store.record_bytes(l, e))
        }
    };
    Ok(Some(StreamPlan {
        store,
        budget_bytes,
        policy: choice.policy,
        io,
        verify_digests: choice.verify_digests,
        pinned,
        prefetch: choice.prefetch,
    }))
}

/// Whether `model`'s weights fit in the memory available beside what else the command holds (`plan`;
/// none when the memory available is unknown); says so on the log when not.
fn fits(model: &Path, plan: Option<&MemoryPlan>) -> Result<bool, StoreError> {
    let Some(plan) = plan else { return Ok(true) };
    if plan.fits() {
        return Ok(true);
    }
    let h = human_bytes;
    if plan.reserved() > plan.available {
        return Err(StoreError::NoRoom {
            model: model.to_path_buf(),
            needs: plan.reserved_text(),
            available: plan.available,
            kv: plan.kv > 0,
        });
    }
    tracing::info!(
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

/// The in-place index beside `model`, written now: streaming without a second copy of the experts.
fn index_beside(model: &Path, progress: &mut dyn FnMut(u64, u64)) -> Result<PathBuf, StoreError> {
    let out = default_store(model, Layout::InPlace);
    tracing::info!(
        "indexing the experts of {} into {} (once; no copy of them is made)",
        model.display(),
        out.display()
    );
    let gguf = GgufFile::open(model).map_err(titan_engine::EngineError::from)?;
    write_index(&gguf, &out, false, progress).map_err(|e| StoreError::IndexBeside {
        path: out.clone(),
        error: Box::new(e),
    })?;
    Ok(out)
}

/// The bounded expert cache over the store `s` names, its pinned experts loaded (the caller starts the
/// warming once the rest of the model is in).
fn open_cache(s: &StreamPlan, file: &GgufFile) -> Result<ExpertCache, StoreError> {
    let open = |direct_io| {
        Store::open_with(
            &s.store,
            file,
            &StoreOptions {
                direct_io,
                verify_digests: s.verify_digests,
            },
        )
    };
    let store = match s.io {
        ReadMode::Buffered => open(false)?,
        ReadMode::Direct => open(true)?,
        ReadMode::DirectIfSupported => match open(true) {
            Err(StoreError::DirectIoUnsupported { .. }) => open(false)?,
            r => r?,
        },
    };
    // Its records only feed the kernels: laid out for them as they land, as resident weights are at load.
    let opts = CacheOptions {
        policy: s.policy,
        regroup: true,
        ..CacheOptions::new(Budget::Bytes(s.budget_bytes))
    };
    let cache = ExpertCache::new(Arc::new(store), &opts)?;
    if let Some(w) = cache.warning() {
        tracing::warn!("{w}");
    }
    cache.pin(&s.pinned)?;
    Ok(cache)
}

/// Loads `path` with its experts where `plan` says: resident (`None`), or streamed through a cache.
pub fn load_model(path: &Path, plan: Option<&StreamPlan>) -> Result<Model, StoreError> {
    let Some(s) = plan else {
        return Ok(Model::load(path)?);
    };
    let model = Model::load_with_experts(path, |weights| {
        let cache = open_cache(s, &weights.file).map_err(|e| titan_engine::EngineError::Experts(Box::new(e)))?;
        // Only now: the warming's reads slowed the reading of the dense weights, and so the first token
        // (on the 2-core Zen 3 EPYC, 8–11 s became 10–16 s with four warming reads at once).
        cache
            .warm()
            .map_err(|e| titan_engine::EngineError::Experts(Box::new(e)))?;
        Ok(Box::new(StreamedExperts::new(
            cache,
            weights.extras.clone(),
            s.prefetch,
        )))
    })?;
    Ok(model)
}

/// A model's experts and nothing else, for an expert node, where `plan` says: resident (only the expert
/// tensors are copied or regrouped; the dense weights are never touched, so never paged in), or streamed.
/// Returns the config, the source and the bytes of experts it offers.
pub fn load_experts(path: &Path, plan: Option<&StreamPlan>) -> Result<(Config, Box<dyn Experts>, u64), StoreError> {
    match plan {
        None => {
            let (config, source) = Model::load_experts(path)?;
            let file = GgufFile::open(path).map_err(titan_engine::EngineError::from)?;
            Ok((config, Box::new(source), titan_layout::dense_and_expert_bytes(&file).1))
        }
        Some(s) => {
            let file = GgufFile::open(path).map_err(titan_engine::EngineError::from)?;
            let config = Config::from_gguf(&file)?;
            let extras = Arc::new(ExpertExtras::load(&file, &config)?);
            let cache = open_cache(s, &file)?;
            cache.warm()?;
            let budget = cache.budget_bytes();
            Ok((
                config,
                Box::new(StreamedExperts::new(cache, extras, s.prefetch)),
                budget,
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{cgroup_headroom, KvPlan, MemoryPlan, MARGIN};
    use std::path::Path;
    use titan_engine::Config;

    /// The automatic budget is what the memory available leaves beside the dense weights, every sequence's
    /// KV cache at the positions it can use, and the margin; a model fits when its experts do too.
    #[test]
    fn the_expert_budget_leaves_room_for_the_kv_caches() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3moe/q8_0.gguf");
        let gguf = titan_gguf::GgufFile::open(&path).unwrap();
        let config = Config::from_gguf(&gguf).unwrap();
        let (dense, experts) = titan_layout::dense_and_expert_bytes(&gguf);
        let kv = |n: usize| u64::try_from(config.kv_bytes(n)).unwrap();
        assert!(kv(1) > 0);
        let available = dense + experts + MARGIN + 4 * kv(100);

        // Four slots of 100 positions fill the memory exactly: the experts fit, with not a byte to spare.
        let slots = KvPlan {
            sequences: 4,
            ctx: Some(100),
            used: None,
            past_training: false,
            mtp: false,
        };
        let plan = MemoryPlan::new(&gguf, slots, available);
        assert!(plan.fits());
        assert_eq!(plan.expert_budget(), experts);
        assert!(!MemoryPlan::new(&gguf, slots, available - 1).fits());

        // A run that can use only 60 of its 100 positions plans for 60.
        let one = KvPlan {
            sequences: 1,
            ctx: Some(100),
            used: Some(60),
            past_training: false,
            mtp: false,
        };
        let run = MemoryPlan::new(&gguf, one, available);
        assert_eq!(run.expert_budget(), experts + 4 * kv(100) - kv(60));
        // Without a context size, the default context: the training context, at most 4096.
        let default = MemoryPlan::new(
            &gguf,
            KvPlan {
                sequences: 2,
                ctx: None,
                used: None,
                past_training: false,
                mtp: false,
            },
            available,
        );
        assert_eq!(default.kv, 2 * kv(config.n_ctx_train.min(4096)));
        // A context past the training one is planned only where allowed; elsewhere it is refused later.
        let long = |past_training| {
            let kv = KvPlan {
                sequences: 1,
                ctx: Some(1 << 30),
                used: None,
                past_training,
                mtp: false,
            };
            MemoryPlan::new(&gguf, kv, available).kv
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

    /// Sequences that draft with the MTP block hold its cache too: planned where the model has one TITAN runs.
    #[test]
    fn the_mtp_blocks_cache_is_planned_with_the_sequences() {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
        for (file, block) in [("qwen3next-mtp/q8_0.gguf", true), ("qwen3moe/q8_0.gguf", false)] {
            let gguf = titan_gguf::GgufFile::open(fixtures.join(file)).unwrap();
            let config = Config::from_gguf(&gguf).unwrap();
            let kv = |mtp| {
                let plan = KvPlan {
                    sequences: 3,
                    ctx: Some(100),
                    used: None,
                    past_training: false,
                    mtp,
                };
                MemoryPlan::new(&gguf, plan, u64::MAX).kv
            };
            // One attention layer's keys and values in f32, per position and sequence.
            let block_bytes = if block {
                3 * 100 * 2 * 4 * config.kv_dim() as u64
            } else {
                0
            };
            assert_eq!(kv(true) - kv(false), block_bytes, "{file}");
        }
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
}
