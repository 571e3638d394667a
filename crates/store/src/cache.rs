//! `ExpertCache`: a bounded set of resident expert records in front of the store.
//!
//! A layer's misses are issued together to the I/O pool and the caller waits for all of them (or handles
//! each as it arrives with `get_layer_with`), so reads overlap each other and, with the callback, the
//! computation of the experts already here. Prefetches land in the same cache. Reads of a record already in
//! flight are joined, never duplicated.
//!
//! Counting (per layer, summed for the total): a request is one expert id passed to `get_layer`; it is a
//! *hit* if the record was resident or already being read (by a prefetch or another caller), else a *miss*,
//! whose read this call issued. `bytes_read` and `read_ns` cover every read from disk (misses, prefetches,
//! pins), by the layer of the record read; `stall_ns` is time `get_layer` spent blocked waiting for reads.
//! A prefetch is *used* when a request finds it (resident or still in flight) before it is evicted.

use std::collections::{BTreeSet, HashMap};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use serde::Serialize;

use crate::pool::IoPool;
use crate::{ExpertRecord, Store, StoreError};

/// How much memory the cache may hold in records (padded record sizes; dense weights are not its business).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Budget {
    Bytes(u64),
    /// `n` of the largest record per MoE layer.
    ExpertsPerLayer(u64),
}

/// Which unpinned record to evict when a new one does not fit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum Policy {
    /// Least recently used: the record whose last request is oldest.
    #[default]
    Lru,
    /// Least frequently used: the record requested the fewest times since it was loaded, the least
    /// recently used among equals. Keeps experts that stay popular across tokens, at the cost of evicting
    /// newcomers first.
    Lfu,
}

#[derive(Clone, Debug)]
pub struct CacheOptions {
    pub budget: Budget,
    pub policy: Policy,
    /// Reads in flight at once. Eight keeps an NVMe queue busy for top-8 routing without oversubscribing.
    pub io_threads: usize,
}

impl CacheOptions {
    pub fn new(budget: Budget) -> CacheOptions {
        CacheOptions {
            budget,
            policy: Policy::Lru,
            io_threads: 8,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    pub hits: u64,
    pub misses: u64,
    pub bytes_read: u64,
    pub read_ns: u64,
    pub stall_ns: u64,
    pub prefetch_issued: u64,
    pub prefetch_used: u64,
    pub evictions: u64,
}

impl Counters {
    fn add(&mut self, o: &Counters) {
        self.hits += o.hits;
        self.misses += o.misses;
        self.bytes_read += o.bytes_read;
        self.read_ns += o.read_ns;
        self.stall_ns += o.stall_ns;
        self.prefetch_issued += o.prefetch_issued;
        self.prefetch_used += o.prefetch_used;
        self.evictions += o.evictions;
    }

    /// hits / requests, or 0 with no requests.
    pub fn hit_rate(&self) -> f64 {
        let n = self.hits + self.misses;
        if n == 0 {
            0.0
        } else {
            self.hits as f64 / n as f64
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct CacheStats {
    pub policy: Policy,
    pub budget_bytes: u64,
    pub budget_warning: Option<String>,
    pub resident_bytes: u64,
    pub pinned_bytes: u64,
    pub resident_records: usize,
    pub total: Counters,
    /// Indexed by layer (dense layers stay zero).
    pub layers: Vec<Counters>,
}

type Key = (usize, usize);
/// A finished read: the record, or `None` if the read failed (the waiter re-reads to get the error itself,
/// because `StoreError` holds an `io::Error`, which cannot be cloned to every waiter).
type Outcome = Option<Arc<ExpertRecord>>;

/// A finished read delivered to one waiter: its index in the request, and the outcome.
type Arrival = (usize, Outcome);

/// A read in flight: its outcome once known, and who to tell.
#[derive(Default)]
struct Pending {
    slot: Mutex<PendingSlot>,
}

#[derive(Default)]
struct PendingSlot {
    outcome: Option<Outcome>,
    waiters: Vec<(usize, Sender<Arrival>)>,
}

impl Pending {
    fn subscribe(&self, index: usize, tx: &Sender<Arrival>) {
        let mut slot = lock(&self.slot);
        match &slot.outcome {
            // A send fails only if the receiver gave up (an error was returned); nothing to tell then.
            Some(outcome) => drop(tx.send((index, outcome.clone()))),
            None => slot.waiters.push((index, tx.clone())),
        }
    }

    fn complete(&self, outcome: Outcome) {
        let mut slot = lock(&self.slot);
        for (index, tx) in slot.waiters.drain(..) {
            let _ = tx.send((index, outcome.clone()));
        }
        slot.outcome = Some(outcome);
    }
}

struct Entry {
    rec: Arc<ExpertRecord>,
    /// Position in `State::order` (unused while pinned).
    rank: (u64, u64),
    uses: u64,
    pinned: bool,
    prefetched_unused: bool,
}

struct InFlight {
    pending: Arc<Pending>,
    /// Issued by `prefetch` and not yet requested.
    prefetch_unclaimed: bool,
}

struct State {
    entries: HashMap<Key, Entry>,
    /// Unpinned entries by eviction rank: the first is the next victim.
    order: BTreeSet<((u64, u64), Key)>,
    in_flight: HashMap<Key, InFlight>,
    resident: u64,
    pinned: u64,
    /// Advances on every insert and request, so ranks are unique and order recency.
    tick: u64,
    layers: Vec<Counters>,
}

struct Shared {
    store: Arc<Store>,
    policy: Policy,
    budget: u64,
    state: Mutex<State>,
}

pub struct ExpertCache {
    shared: Arc<Shared>,
    // Not inside `Shared`: queued jobs hold `Shared`, and the last of them must not be the one to drop (and
    // join) the pool from one of its own threads.
    pool: IoPool,
    warning: Option<String>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // No code panics while holding these locks; if one ever did, its data is still consistent enough to
    // keep serving (at worst a counter is off), which beats failing every later request.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ExpertCache {
    /// The least budget that holds one record of every MoE layer (the largest record, per layer).
    pub fn min_budget(store: &Store) -> u64 {
        store.max_record_bytes() * store.layers().len() as u64
    }

    /// A cache over `store`; a budget below `min_budget` is raised to it, with the warning in `warning()`.
    pub fn new(store: Arc<Store>, opts: &CacheOptions) -> Result<ExpertCache, StoreError> {
        let min = Self::min_budget(&store);
        let requested = match opts.budget {
            Budget::Bytes(b) => b,
            Budget::ExpertsPerLayer(n) => n.saturating_mul(min),
        };
        let warning = (requested < min).then(|| {
            format!(
                "expert budget {} is below one expert per layer ({} MoE layers × {}); raised to {}",
                fmt_bytes(requested),
                store.layers().len(),
                fmt_bytes(store.max_record_bytes()),
                fmt_bytes(min)
            )
        });
        let pool = IoPool::new(opts.io_threads).map_err(StoreError::io(store.path()))?;
        let state = State {
            entries: HashMap::new(),
            order: BTreeSet::new(),
            in_flight: HashMap::new(),
            resident: 0,
            pinned: 0,
            tick: 0,
            layers: vec![Counters::default(); store.n_layer()],
        };
        let shared = Shared {
            store,
            policy: opts.policy,
            budget: requested.max(min),
            state: Mutex::new(state),
        };
        Ok(ExpertCache {
            shared: Arc::new(shared),
            pool,
            warning,
        })
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.shared.store
    }

    pub fn budget_bytes(&self) -> u64 {
        self.shared.budget
    }

    /// Whether the record is in memory now (a later request would be a hit unless it is evicted first).
    pub fn is_resident(&self, layer: usize, expert: usize) -> bool {
        lock(&self.shared.state)
            .entries
            .contains_key(&(layer, expert))
    }

    /// Set when the requested budget was raised to the minimum.
    pub fn warning(&self) -> Option<&str> {
        self.warning.as_deref()
    }

    /// The records of `experts` in `layer`, in the order given: hits from memory, all misses read in
    /// parallel; returns when every one is here.
    pub fn get_layer(
        &self,
        layer: usize,
        experts: &[u32],
    ) -> Result<Vec<Arc<ExpertRecord>>, StoreError> {
        self.get_layer_with(layer, experts, &mut |_, _| {})
    }

    /// As `get_layer`, calling `on_ready(i, record)` for `experts[i]` as soon as it is available (hits first,
    /// then misses in arrival order), so the caller can compute with it while the other reads finish.
    /// Arrival order varies: a caller that needs determinism combines the results afterwards in its own order.
    pub fn get_layer_with(
        &self,
        layer: usize,
        experts: &[u32],
        on_ready: &mut dyn FnMut(usize, &Arc<ExpertRecord>),
    ) -> Result<Vec<Arc<ExpertRecord>>, StoreError> {
        let keys: Vec<Key> = experts.iter().map(|&e| (layer, e as usize)).collect();
        self.fetch(&keys, true, on_ready)
    }

    /// Start reading `experts` of `layer` in the background unless resident or already in flight; returns
    /// at once. The records land in the cache like any other.
    pub fn prefetch(&self, layer: usize, experts: &[u32]) -> Result<(), StoreError> {
        let mut issue = Vec::new();
        {
            let mut st = lock(&self.shared.state);
            for &e in experts {
                let key = (layer, e as usize);
                self.check_key(key)?;
                if st.entries.contains_key(&key) || st.in_flight.contains_key(&key) {
                    continue;
                }
                let pending = Arc::new(Pending::default());
                st.in_flight.insert(
                    key,
                    InFlight {
                        pending: Arc::clone(&pending),
                        prefetch_unclaimed: true,
                    },
                );
                st.layers[layer].prefetch_issued += 1;
                issue.push((key, pending));
            }
        }
        for (key, pending) in issue {
            self.submit(key, pending);
        }
        Ok(())
    }

    /// Load `experts` (layer, expert) and keep them resident for the life of the cache. They count in the
    /// budget; pinning more than the budget holds is an error.
    pub fn pin(&self, experts: &[(usize, usize)]) -> Result<(), StoreError> {
        let mut keys = experts.to_vec();
        keys.sort_unstable();
        keys.dedup();
        for &k in &keys {
            self.check_key(k)?;
        }
        self.check_pin_budget(&lock(&self.shared.state), &keys)?;
        let recs = self.fetch(&keys, false, &mut |_, _| {})?;
        let mut st = lock(&self.shared.state);
        self.check_pin_budget(&st, &keys)?;
        for rec in recs {
            st.pin((rec.layer, rec.expert), rec, self.shared.budget);
        }
        Ok(())
    }

    pub fn stats(&self) -> CacheStats {
        let st = lock(&self.shared.state);
        let mut total = Counters::default();
        for c in &st.layers {
            total.add(c);
        }
        CacheStats {
            policy: self.shared.policy,
            budget_bytes: self.shared.budget,
            budget_warning: self.warning.clone(),
            resident_bytes: st.resident,
            pinned_bytes: st.pinned,
            resident_records: st.entries.len(),
            total,
            layers: st.layers.clone(),
        }
    }

    fn check_key(&self, (layer, expert): Key) -> Result<(), StoreError> {
        match self.shared.store.record_bytes(layer, expert) {
            Some(_) => Ok(()),
            None => Err(StoreError::NoRecord { layer, expert }),
        }
    }

    fn check_pin_budget(&self, st: &State, keys: &[Key]) -> Result<(), StoreError> {
        let store = &self.shared.store;
        let new: u64 = keys
            .iter()
            .filter(|k| !st.entries.get(k).is_some_and(|e| e.pinned))
            .filter_map(|&(l, e)| store.record_bytes(l, e))
            .sum();
        let need = st.pinned + new;
        if need > self.shared.budget {
            return Err(StoreError::PinOverBudget {
                need,
                budget: self.shared.budget,
            });
        }
        Ok(())
    }

    /// The shared path of `get_layer` (`demand`: counted, recency updated) and `pin` (neither).
    fn fetch(
        &self,
        keys: &[Key],
        demand: bool,
        on_ready: &mut dyn FnMut(usize, &Arc<ExpertRecord>),
    ) -> Result<Vec<Arc<ExpertRecord>>, StoreError> {
        for &k in keys {
            self.check_key(k)?;
        }
        let mut out: Vec<Option<Arc<ExpertRecord>>> = vec![None; keys.len()];
        let mut waits = Vec::new();
        let mut issue = Vec::new();
        {
            let mut st = lock(&self.shared.state);
            for (i, &key) in keys.iter().enumerate() {
                if let Some(rec) = st.request_resident(key, demand, self.shared.policy) {
                    out[i] = Some(rec);
                } else if let Some(f) = st.in_flight.get_mut(&key) {
                    let used = demand && std::mem::take(&mut f.prefetch_unclaimed);
                    waits.push((i, Arc::clone(&f.pending)));
                    let c = &mut st.layers[key.0];
                    c.hits += u64::from(demand);
                    c.prefetch_used += u64::from(used);
                } else {
                    let pending = Arc::new(Pending::default());
                    st.in_flight.insert(
                        key,
                        InFlight {
                            pending: Arc::clone(&pending),
                            prefetch_unclaimed: false,
                        },
                    );
                    st.layers[key.0].misses += u64::from(demand);
                    waits.push((i, Arc::clone(&pending)));
                    issue.push((key, pending));
                }
            }
        }
        // Misses first, so the reads run while the caller computes with the hits.
        for (key, pending) in issue {
            self.submit(key, pending);
        }
        for (i, rec) in out.iter().enumerate() {
            if let Some(rec) = rec {
                on_ready(i, rec);
            }
        }

        let (tx, rx) = mpsc::channel();
        for (i, pending) in &waits {
            pending.subscribe(*i, &tx);
        }
        drop(tx);
        let mut stall = 0u64;
        for _ in 0..waits.len() {
            let t = Instant::now();
            let arrival = rx.recv();
            let (i, outcome) = match arrival {
                Ok(a) => a,
                // Every pending read completes and sends; a closed channel means a read job was lost.
                Err(_) => break,
            };
            let rec = match outcome {
                Some(rec) => rec,
                None => Arc::new(self.shared.store.read(keys[i].0, keys[i].1)?),
            };
            stall += t.elapsed().as_nanos() as u64;
            on_ready(i, &rec);
            out[i] = Some(rec);
        }
        if demand {
            if let Some(&(layer, _)) = keys.first() {
                lock(&self.shared.state).layers[layer].stall_ns += stall;
            }
        }
        // Anything not delivered (a read job lost) is read here, and reported like every other record: a
        // caller that computes in `on_ready` must see each record exactly once.
        for (i, rec) in out.iter_mut().enumerate() {
            if rec.is_none() {
                let read = Arc::new(self.shared.store.read(keys[i].0, keys[i].1)?);
                on_ready(i, &read);
                *rec = Some(read);
            }
        }
        Ok(out.into_iter().flatten().collect())
    }

    fn submit(&self, key: Key, pending: Arc<Pending>) {
        let shared = Arc::clone(&self.shared);
        self.pool
            .submit(Box::new(move || shared.read_into_cache(key, &pending)));
    }
}

impl Shared {
    /// The I/O job: read one record, put it in the cache (if it fits), tell the waiters.
    fn read_into_cache(&self, key: Key, pending: &Pending) {
        let t = Instant::now();
        let outcome = self.store.read(key.0, key.1).ok().map(Arc::new);
        let ns = t.elapsed().as_nanos() as u64;
        {
            let mut st = lock(&self.state);
            let unclaimed = st
                .in_flight
                .remove(&key)
                .is_some_and(|f| f.prefetch_unclaimed);
            let c = &mut st.layers[key.0];
            c.read_ns += ns;
            if let Some(rec) = &outcome {
                c.bytes_read += rec.resident_bytes();
                st.insert(key, Arc::clone(rec), unclaimed, self.budget, self.policy);
            }
        }
        pending.complete(outcome);
    }
}

impl State {
    fn rank(policy: Policy, uses: u64, tick: u64) -> (u64, u64) {
        match policy {
            Policy::Lru => (tick, 0),
            Policy::Lfu => (uses, tick),
        }
    }

    /// A resident record for a request: counted as a hit and made most recent when `demand`.
    fn request_resident(
        &mut self,
        key: Key,
        demand: bool,
        policy: Policy,
    ) -> Option<Arc<ExpertRecord>> {
        let e = self.entries.get_mut(&key)?;
        let rec = Arc::clone(&e.rec);
        if demand {
            let used = std::mem::take(&mut e.prefetched_unused);
            self.tick += 1;
            e.uses += 1;
            if !e.pinned {
                self.order.remove(&(e.rank, key));
                e.rank = Self::rank(policy, e.uses, self.tick);
                self.order.insert((e.rank, key));
            }
            let c = &mut self.layers[key.0];
            c.hits += 1;
            c.prefetch_used += u64::from(used);
        }
        Some(rec)
    }

    /// Make room by evicting unpinned records in policy order, then insert. A record that cannot fit
    /// beside the pinned set is not kept (the caller still gets it).
    fn insert(
        &mut self,
        key: Key,
        rec: Arc<ExpertRecord>,
        prefetched_unused: bool,
        budget: u64,
        policy: Policy,
    ) {
        let size = rec.resident_bytes();
        if self.entries.contains_key(&key) || size > budget.saturating_sub(self.pinned) {
            return;
        }
        while self.resident + size > budget {
            if !self.evict_one() {
                return;
            }
        }
        self.tick += 1;
        let rank = Self::rank(policy, 1, self.tick);
        self.order.insert((rank, key));
        self.entries.insert(
            key,
            Entry {
                rec,
                rank,
                uses: 1,
                pinned: false,
                prefetched_unused,
            },
        );
        self.resident += size;
    }

    fn evict_one(&mut self) -> bool {
        let Some((_, key)) = self.order.pop_first() else {
            return false;
        };
        if let Some(e) = self.entries.remove(&key) {
            self.resident -= e.rec.resident_bytes();
            self.layers[key.0].evictions += 1;
        }
        true
    }

    /// Keep `rec` resident for good, evicting unpinned records to make room (the caller checked that the
    /// pinned total fits the budget, so that is always enough).
    fn pin(&mut self, key: Key, rec: Arc<ExpertRecord>, budget: u64) {
        let size = rec.resident_bytes();
        match self.entries.get_mut(&key) {
            Some(e) if e.pinned => return,
            Some(e) => {
                self.order.remove(&(e.rank, key));
                e.pinned = true;
            }
            None => {
                while self.resident + size > budget && self.evict_one() {}
                self.entries.insert(
                    key,
                    Entry {
                        rec,
                        rank: (0, 0),
                        uses: 0,
                        pinned: true,
                        prefetched_unused: false,
                    },
                );
                self.resident += size;
            }
        }
        self.pinned += size;
    }
}

/// Sizes for messages: "1.50 GiB", "340.0 MiB", "512 bytes".
fn fmt_bytes(n: u64) -> String {
    const UNITS: [(&str, f64); 3] = [
        ("GiB", (1u64 << 30) as f64),
        ("MiB", (1u64 << 20) as f64),
        ("KiB", 1024.0),
    ];
    for (unit, size) in UNITS {
        if n as f64 >= size {
            return format!("{:.2} {unit}", n as f64 / size);
        }
    }
    format!("{n} bytes")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{convert_default, gguf_slice, test_dir, write_model, Spec};
    use crate::{Layout, Manifest, StoreOptions};
    use std::time::Duration;
    use titan_gguf::GgufFile;
    use titan_kernels::GgmlType;

    /// Two MoE layers of eight experts, every record the same size (four 4 KiB pages).
    fn uniform() -> Spec {
        let q = GgmlType::Q8_0;
        Spec {
            n_layer: 2,
            dense: vec![],
            n_expert: 8,
            n_embd: 64,
            n_ff: 64,
            types: vec![[q, q, q]],
            seed: 3,
        }
    }

    struct Fixture {
        _dir: tempfile::TempDir,
        gguf: GgufFile,
        store: Arc<Store>,
    }

    fn fixture(spec: &Spec, direct_io: bool) -> Fixture {
        fixture_of(spec, direct_io, Layout::Copy)
    }

    fn fixture_of(spec: &Spec, direct_io: bool, layout: Layout) -> Fixture {
        let dir = test_dir();
        let gguf = write_model(dir.path(), "m.gguf", spec);
        let out = match layout {
            Layout::Copy => convert_default(&gguf, dir.path()),
            Layout::InPlace => {
                let out = dir.path().join("m.titan-index");
                crate::write_index(&gguf, &out, false, &mut |_, _| {}).unwrap();
                out
            }
        };
        let store = Store::open_with(
            &out,
            &gguf,
            &StoreOptions {
                direct_io,
                verify_digests: true,
            },
        )
        .unwrap();
        Fixture {
            _dir: dir,
            gguf,
            store: Arc::new(store),
        }
    }

    fn cache(f: &Fixture, budget: Budget, policy: Policy) -> ExpertCache {
        ExpertCache::new(
            Arc::clone(&f.store),
            &CacheOptions {
                budget,
                policy,
                io_threads: 4,
            },
        )
        .unwrap()
    }

    fn resident(c: &ExpertCache, layer: usize, n: usize) -> Vec<usize> {
        (0..n).filter(|&e| c.is_resident(layer, e)).collect()
    }

    /// The record holds the model's bytes of that expert.
    fn check_record(gguf: &GgufFile, rec: &ExpertRecord) {
        for (part, t) in [("gate", rec.gate()), ("up", rec.up()), ("down", rec.down())] {
            assert!(
                t.data == gguf_slice(gguf, rec.layer, rec.expert, part),
                "{part} of ({}, {})",
                rec.layer,
                rec.expert
            );
        }
    }

    const S: u64 = 16384;

    #[test]
    fn a_budget_below_one_expert_per_layer_is_raised_with_a_warning() {
        let f = fixture(&uniform(), false);
        assert_eq!(f.store.max_record_bytes(), S);
        assert_eq!(ExpertCache::min_budget(&f.store), 2 * S);
        let c = cache(&f, Budget::Bytes(1000), Policy::Lru);
        assert_eq!(c.budget_bytes(), 2 * S);
        let w = c.warning().unwrap();
        assert!(
            w.contains("below one expert per layer") && w.contains("raised to 32.00 KiB"),
            "{w}"
        );
        assert_eq!(c.stats().budget_warning.as_deref(), Some(w));
        let c = cache(&f, Budget::ExpertsPerLayer(3), Policy::Lru);
        assert_eq!((c.budget_bytes(), c.warning()), (6 * S, None));
        // At the minimum every request still gets its records, top-8 included.
        let c = cache(&f, Budget::ExpertsPerLayer(1), Policy::Lru);
        for l in 0..2 {
            let recs = c.get_layer(l, &[7, 6, 5, 4, 3, 2, 1, 0]).unwrap();
            assert_eq!(
                recs.iter().map(|r| r.expert).collect::<Vec<_>>(),
                vec![7, 6, 5, 4, 3, 2, 1, 0]
            );
            recs.iter().for_each(|r| check_record(&f.gguf, r));
            assert!(c.stats().resident_bytes <= c.budget_bytes());
        }
    }

    #[test]
    fn lru_evicts_the_least_recently_used() {
        let f = fixture(&uniform(), false);
        let c = cache(&f, Budget::Bytes(3 * S), Policy::Lru);
        for e in [0, 0, 0, 1, 2] {
            c.get_layer(0, &[e]).unwrap();
        }
        c.get_layer(0, &[3]).unwrap();
        // 0 was used most often but longest ago.
        assert_eq!(resident(&c, 0, 8), vec![1, 2, 3]);
        c.get_layer(0, &[1]).unwrap();
        c.get_layer(0, &[4]).unwrap();
        assert_eq!(resident(&c, 0, 8), vec![1, 3, 4]);
        let t = c.stats().total;
        assert_eq!((t.hits, t.misses, t.evictions), (3, 5, 2));
    }

    #[test]
    fn lfu_evicts_the_least_frequently_used_then_the_oldest() {
        let f = fixture(&uniform(), false);
        let c = cache(&f, Budget::Bytes(3 * S), Policy::Lfu);
        for e in [0, 0, 0, 1, 2] {
            c.get_layer(0, &[e]).unwrap();
        }
        c.get_layer(0, &[3]).unwrap();
        // 1 and 2 were used once each; 1 longer ago.
        assert_eq!(resident(&c, 0, 8), vec![0, 2, 3]);
        c.get_layer(0, &[3]).unwrap();
        c.get_layer(0, &[4]).unwrap();
        assert_eq!(resident(&c, 0, 8), vec![0, 3, 4]);
        assert_eq!(c.stats().policy, Policy::Lfu);
    }

    #[test]
    fn pinned_experts_are_never_evicted() {
        let f = fixture(&uniform(), false);
        let c = cache(&f, Budget::Bytes(3 * S), Policy::Lru);
        c.get_layer(1, &[5]).unwrap();
        c.pin(&[(0, 5), (1, 5)]).unwrap();
        assert_eq!(c.stats().pinned_bytes, 2 * S);
        for round in 0..3 {
            for l in 0..2 {
                for e in 0..8 {
                    c.get_layer(l, &[e, (e + round) % 8]).unwrap();
                    assert!(c.is_resident(0, 5) && c.is_resident(1, 5));
                    assert!(c.stats().resident_bytes <= c.budget_bytes());
                }
            }
        }
        // Pinning what is already pinned is free; more than the budget is refused.
        c.pin(&[(0, 5)]).unwrap();
        let err = c.pin(&[(0, 1), (0, 2)]).unwrap_err();
        assert!(
            matches!(err, StoreError::PinOverBudget { need, budget } if need == 4 * S && budget == 3 * S),
            "{err}"
        );
        assert!(matches!(
            c.pin(&[(0, 8)]),
            Err(StoreError::NoRecord {
                layer: 0,
                expert: 8
            })
        ));
    }

    #[test]
    fn counters_add_up_and_the_budget_holds() {
        let spec = Spec::mixed();
        let f = fixture(&spec, true);
        let budget = ExpertCache::min_budget(&f.store) * 2;
        let c = cache(&f, Budget::Bytes(budget), Policy::Lru);
        let mut rng = crate::testutil::Rng::new(11);
        let mut requests = vec![0u64; spec.n_layer];
        for _ in 0..200 {
            let layer = (rng.next() % spec.n_layer as u64) as usize;
            let k = 1 + (rng.next() % 4) as usize;
            let experts: Vec<u32> = (0..k)
                .map(|_| (rng.next() % spec.n_expert as u64) as u32)
                .collect();
            let recs = c.get_layer(layer, &experts).unwrap();
            for (rec, &e) in recs.iter().zip(&experts) {
                assert_eq!((rec.layer, rec.expert), (layer, e as usize));
                check_record(&f.gguf, rec);
            }
            requests[layer] += k as u64;
            let s = c.stats();
            assert!(
                s.resident_bytes <= s.budget_bytes,
                "{} > {}",
                s.resident_bytes,
                s.budget_bytes
            );
        }
        let s = c.stats();
        let mut total_bytes = 0;
        for (l, counters) in s.layers.iter().enumerate() {
            assert_eq!(counters.hits + counters.misses, requests[l], "layer {l}");
            assert_eq!(
                counters.bytes_read,
                counters.misses * f.store.record_bytes(l, 0).unwrap(),
                "layer {l}"
            );
            total_bytes += counters.bytes_read;
        }
        assert_eq!(s.total.hits + s.total.misses, requests.iter().sum::<u64>());
        assert_eq!(s.total.bytes_read, total_bytes);
        assert!(s.total.hits > 0 && s.total.misses > 0 && s.total.evictions > 0);
        assert!(s.total.read_ns > 0);
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["total"]["misses"], s.total.misses);
        assert_eq!(json["policy"], "Lru");
    }

    #[test]
    fn prefetches_are_counted_when_issued_and_when_used() {
        let f = fixture(&uniform(), false);
        let c = cache(&f, Budget::Bytes(8 * S), Policy::Lru);
        c.prefetch(1, &[2, 3]).unwrap();
        c.prefetch(1, &[3]).unwrap(); // in flight or resident already: not issued again
        let t0 = Instant::now();
        while !(c.is_resident(1, 2) && c.is_resident(1, 3)) {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "prefetch never landed"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let recs = c.get_layer(1, &[2, 3, 4]).unwrap();
        recs.iter().for_each(|r| check_record(&f.gguf, r));
        c.get_layer(1, &[2]).unwrap(); // a second use of a prefetch is just a hit
                                       // Prefetch then request at once: found in flight or resident, either way a hit and a used prefetch.
        c.prefetch(0, &[7]).unwrap();
        c.get_layer(0, &[7]).unwrap();
        c.prefetch(0, &[6]).unwrap(); // never used
        let t0 = Instant::now();
        while !c.is_resident(0, 6) {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "prefetch never landed"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let s = c.stats();
        assert_eq!(
            (s.layers[1].prefetch_issued, s.layers[1].prefetch_used),
            (2, 2)
        );
        assert_eq!((s.layers[1].hits, s.layers[1].misses), (3, 1));
        assert_eq!(
            (
                s.layers[0].prefetch_issued,
                s.layers[0].prefetch_used,
                s.layers[0].hits,
                s.layers[0].misses
            ),
            (2, 1, 1, 0)
        );
        assert_eq!(
            s.total.bytes_read,
            (s.total.misses + s.total.prefetch_issued) * S
        );
    }

    #[test]
    fn get_layer_with_reports_each_record_as_it_arrives() {
        let f = fixture(&uniform(), false);
        let c = cache(&f, Budget::Bytes(8 * S), Policy::Lru);
        c.get_layer(0, &[1]).unwrap();
        let mut seen = Vec::new();
        let recs = c
            .get_layer_with(0, &[4, 1, 6, 1], &mut |i, rec| seen.push((i, rec.expert)))
            .unwrap();
        // The hits first (in request order), then the misses in whatever order they arrive.
        assert_eq!(&seen[..2], &[(1, 1), (3, 1)]);
        seen.sort_unstable();
        assert_eq!(seen, vec![(0, 4), (1, 1), (2, 6), (3, 1)]);
        assert_eq!(
            recs.iter().map(|r| r.expert).collect::<Vec<_>>(),
            vec![4, 1, 6, 1]
        );
    }

    #[test]
    fn a_record_that_fails_its_digest_is_never_returned_or_cached() {
        let f = fixture(&uniform(), false);
        let m = Manifest::load(&f.store.path().join(crate::MANIFEST_FILE)).unwrap();
        let r = m.records[8 + 3].clone(); // layer 1, expert 3
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(f.store.path().join(crate::EXPERTS_FILE))
            .unwrap();
        std::os::unix::fs::FileExt::write_all_at(&file, &[0xAB], r.offset + 100).unwrap();
        let c = cache(&f, Budget::Bytes(8 * S), Policy::Lru);
        for _ in 0..2 {
            let err = c.get_layer(1, &[2, 3, 4]).unwrap_err();
            assert!(
                matches!(err, StoreError::Digest { layer: 1, expert: 3, offset, .. } if offset == r.offset),
                "{err}"
            );
            assert!(
                err.to_string()
                    .starts_with("expert 3 of layer 1 failed its digest check in "),
                "{err}"
            );
            assert!(!c.is_resident(1, 3));
        }
        c.prefetch(1, &[3]).unwrap();
        assert!(matches!(
            c.get_layer(1, &[3]),
            Err(StoreError::Digest { .. })
        ));
        assert!(!c.is_resident(1, 3));
        assert!(matches!(c.pin(&[(1, 3)]), Err(StoreError::Digest { .. })));
        // The good neighbours are unaffected.
        c.get_layer(1, &[2, 4])
            .unwrap()
            .iter()
            .for_each(|r| check_record(&f.gguf, r));
    }

    #[test]
    fn concurrent_requests_from_two_threads_are_safe() {
        for layout in [Layout::Copy, Layout::InPlace] {
            concurrent_requests(layout);
        }
    }

    fn concurrent_requests(layout: Layout) {
        let spec = Spec::q4_k_m();
        let f = fixture_of(&spec, true, layout);
        let c = cache(&f, Budget::ExpertsPerLayer(3), Policy::Lru);
        let calls = 150;
        std::thread::scope(|s| {
            for t in 0..2u64 {
                let (c, f) = (&c, &f);
                s.spawn(move || {
                    let mut rng = crate::testutil::Rng::new(100 + t);
                    for _ in 0..calls {
                        let layer = 1 + (rng.next() % 2) as usize;
                        let experts: Vec<u32> = (0..4).map(|_| (rng.next() % 8) as u32).collect();
                        if rng.next().is_multiple_of(4) {
                            c.prefetch(layer, &[(rng.next() % 8) as u32]).unwrap();
                        }
                        let recs = c.get_layer(layer, &experts).unwrap();
                        for (rec, &e) in recs.iter().zip(&experts) {
                            assert_eq!((rec.layer, rec.expert), (layer, e as usize));
                            check_record(&f.gguf, rec);
                        }
                        assert!(c.stats().resident_bytes <= c.budget_bytes());
                    }
                });
            }
        });
        let s = c.stats();
        assert_eq!(s.total.hits + s.total.misses, 2 * calls * 4);
        assert!(s.total.prefetch_used <= s.total.prefetch_issued);
    }
}
