//! `ExpertCache`: a bounded set of resident expert records in front of the store.
//!
//! A layer's misses are issued together to the I/O pool and the caller waits for all of them (or handles
//! each as it arrives with `get_layer_with`), so reads overlap each other and, with the callback, the
//! computation of the experts already here. Prefetches land in the same cache. Reads of a record already in
//! flight are joined, never duplicated. Reads a request waits for go ahead of queued prefetches.
//!
//! Counting (per layer, summed for the total): a request is one expert id passed to `get_layer`; it is a
//! *hit* if the record was resident or already being read (by a prefetch or another caller), else a *miss*,
//! whose read this call issued. `bytes_read` and `read_ns` cover every read from disk (misses, prefetches,
//! pins), by the layer of the record read; `stall_ns` is time `get_layer` spent blocked waiting for reads.
//! A prefetch is *used* when a request finds it (resident or still in flight) before it is evicted.
//!
//! An evicted record's buffer is kept, inside the budget, for the read that needed the room: a steady
//! stream of misses then reads into the same few buffers instead of mapping and unmapping one per read.

use std::collections::{BTreeSet, HashMap};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use serde::Serialize;

use crate::pool::{IoPool, Urgency};
use crate::units::human_bytes;
use crate::{AlignedBuf, ExpertRecord, Store, StoreError};

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
    /// Lay each record out for the SIMD kernels as it lands (`ExpertRecord::regroup`), for a cache whose
    /// records only feed the kernels: their bytes are then no longer the GGUF's, their views say so.
    pub regroup: bool,
}

impl CacheOptions {
    pub fn new(budget: Budget) -> CacheOptions {
        CacheOptions {
            budget,
            policy: Policy::Lru,
            io_threads: 8,
            regroup: false,
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
    /// Read-aheads evicted before any request found them, and their bytes: the prefetcher's cost in reads.
    pub prefetch_wasted: u64,
    pub prefetch_wasted_bytes: u64,
    pub evictions: u64,
    /// Reads into the buffer of an evicted record rather than a new one.
    pub buffers_reused: u64,
}

impl Counters {
    pub fn add(&mut self, o: &Counters) {
        self.hits += o.hits;
        self.misses += o.misses;
        self.bytes_read += o.bytes_read;
        self.read_ns += o.read_ns;
        self.stall_ns += o.stall_ns;
        self.prefetch_issued += o.prefetch_issued;
        self.prefetch_used += o.prefetch_used;
        self.prefetch_wasted += o.prefetch_wasted;
        self.prefetch_wasted_bytes += o.prefetch_wasted_bytes;
        self.evictions += o.evictions;
        self.buffers_reused += o.buffers_reused;
    }

    /// What happened between `earlier` and these (later) counters.
    pub fn since(&self, earlier: &Counters) -> Counters {
        Counters {
            hits: self.hits - earlier.hits,
            misses: self.misses - earlier.misses,
            bytes_read: self.bytes_read - earlier.bytes_read,
            read_ns: self.read_ns - earlier.read_ns,
            stall_ns: self.stall_ns - earlier.stall_ns,
            prefetch_issued: self.prefetch_issued - earlier.prefetch_issued,
            prefetch_used: self.prefetch_used - earlier.prefetch_used,
            prefetch_wasted: self.prefetch_wasted - earlier.prefetch_wasted,
            prefetch_wasted_bytes: self.prefetch_wasted_bytes - earlier.prefetch_wasted_bytes,
            evictions: self.evictions - earlier.evictions,
            buffers_reused: self.buffers_reused - earlier.buffers_reused,
        }
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
    /// Records in memory, in use or not.
    pub resident_bytes: u64,
    /// Reads in flight, counted in the budget from the moment they are issued.
    pub in_flight_bytes: u64,
    /// Buffers of evicted records not yet taken by a read, also counted in the budget.
    pub spare_bytes: u64,
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

struct Entry {
    rec: Arc<ExpertRecord>,
    /// Position in `State::order` (kept while the entry is out of it).
    rank: (u64, u64),
    uses: u64,
    pinned: bool,
    /// Requests handed this record that have not finished with it. A busy record is not evictable: the
    /// caller still holds it, so evicting it would free nothing.
    busy: u32,
    /// The read that loaded it (see `InFlight::id`).
    born: u64,
    prefetched_unused: bool,
}

impl Entry {
    fn evictable(&self) -> bool {
        !self.pinned && self.busy == 0
    }
}

struct InFlight {
    /// Who to tell when it lands: each waiting request's channel, and the index there. Requests join
    /// under the state lock and the read lands under it too, so nobody can join once it has landed.
    waiters: Vec<(usize, Sender<Arrival>)>,
    /// Unique per read, so a request's claim on it can be told from a later read of the same record.
    id: u64,
    /// Its size, reserved in the budget from issue until it lands: the spare buffer's length if it has one.
    size: u64,
    /// An evicted record's buffer for it to read into, until the read starts.
    buf: Option<AlignedBuf>,
    /// Requests waiting for it: it lands busy once for each.
    claims: u32,
    /// Issued by `prefetch` or the warming pass and not yet requested.
    prefetch_unclaimed: bool,
    /// Issued by the warming pass.
    warming: bool,
}

/// Who issued a read.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Issuer {
    Request,
    Prefetch,
    Warming,
}

/// The bookkeeping, under one lock. The budget bounds `resident + reserved + spare`: every record in memory
/// is an entry (in use or not) or a read in flight, and every other buffer the cache keeps is a spare, so
/// this is the bound on expert bytes in memory.
struct State {
    entries: HashMap<Key, Entry>,
    /// Evictable entries by eviction rank: the first is the next victim.
    order: BTreeSet<((u64, u64), Key)>,
    in_flight: HashMap<Key, InFlight>,
    resident: u64,
    /// Bytes of `order`'s entries.
    evictable: u64,
    reserved: u64,
    /// Buffers of evicted records, for reads to reuse, and their bytes.
    spares: Vec<AlignedBuf>,
    spare: u64,
    pinned: u64,
    /// Advances on every insert, request and read, so ranks and read ids are unique and order recency.
    tick: u64,
    layers: Vec<Counters>,
    /// Set when the cache is dropped, to stop the warming pass.
    closed: bool,
}

struct Shared {
    store: Arc<Store>,
    policy: Policy,
    budget: u64,
    regroup: bool,
    /// The most reads the warming pass keeps in flight.
    warm_depth: usize,
    state: Mutex<State>,
    /// Signalled whenever memory in the budget may have been freed (a read landed or failed, a request
    /// released a record), and when the cache closes.
    room: Condvar,
}

/// Records handed to a `get_layer_with` callback: each with its index in the request.
pub type Ready = [(usize, Arc<ExpertRecord>)];

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

/// What became of one requested record when the request tried to take it.
enum Admit {
    /// Resident: here it is, claimed (the claim's read id).
    Here(Arc<ExpertRecord>, u64),
    /// Being read, by a read this request just issued (`true`) or by another; it arrives on the request's
    /// channel, claimed.
    Coming(u64, bool),
    /// Not resident and no room to read it until something in the budget is freed.
    NoRoom,
}

/// Records a request has claimed (each `(key, id)`: a claim on that read's record, landed or not) and not
/// yet released. Dropping it releases them all, so a request that ends early, with an error, leaves no
/// record pinned by a claim nobody will release.
struct Claims<'a> {
    shared: &'a Shared,
    held: Vec<(Key, u64)>,
}

impl Claims<'_> {
    fn take(&mut self, key: Key, id: u64) {
        self.held.push((key, id));
    }

    /// Forget one claim (its record was released, or its read failed, which ends every claim on it).
    fn forget(&mut self, key: Key, id: u64) -> bool {
        match self.held.iter().position(|&c| c == (key, id)) {
            Some(p) => {
                self.held.swap_remove(p);
                true
            }
            None => false,
        }
    }

    fn release(&mut self, key: Key, id: u64) {
        if self.forget(key, id) {
            lock(&self.shared.state).release(key, id);
            self.shared.room.notify_all();
        }
    }
}

impl Drop for Claims<'_> {
    fn drop(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let mut st = lock(&self.shared.state);
        for (key, id) in self.held.drain(..) {
            st.release(key, id);
        }
        drop(st);
        self.shared.room.notify_all();
    }
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
                human_bytes(requested),
                store.layers().len(),
                human_bytes(store.max_record_bytes()),
                human_bytes(min)
            )
        });
        let pool = IoPool::new(opts.io_threads).map_err(StoreError::io(store.path()))?;
        let state = State {
            entries: HashMap::new(),
            order: BTreeSet::new(),
            in_flight: HashMap::new(),
            resident: 0,
            evictable: 0,
            reserved: 0,
            spares: Vec::new(),
            spare: 0,
            pinned: 0,
            tick: 0,
            layers: vec![Counters::default(); store.n_layer()],
            closed: false,
        };
        let shared = Shared {
            store,
            policy: opts.policy,
            budget: requested.max(min),
            regroup: opts.regroup,
            warm_depth: (opts.io_threads / 2).max(1),
            state: Mutex::new(state),
            room: Condvar::new(),
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
        lock(&self.shared.state).entries.contains_key(&(layer, expert))
    }

    /// Whether every record of the store is resident, as in a budget the warming pass has filled: a
    /// request can only hit, so reading ahead (and routing ahead to know what to read) is wasted work.
    pub fn holds_every_record(&self) -> bool {
        lock(&self.shared.state).entries.len() == self.shared.store.records().len()
    }

    /// Set when the requested budget was raised to the minimum.
    pub fn warning(&self) -> Option<&str> {
        self.warning.as_deref()
    }

    /// The records of `experts` in `layer`, in the order given. The records returned are the caller's to
    /// keep, outside the budget; a caller that needs the bound computes in `get_layer_with` instead.
    pub fn get_layer(&self, layer: usize, experts: &[u32]) -> Result<Vec<Arc<ExpertRecord>>, StoreError> {
        let mut out = vec![None; experts.len()];
        self.get_layer_with(layer, experts, &mut |ready| {
            for (i, rec) in ready {
                out[*i] = Some(Arc::clone(rec));
            }
        })?;
        Ok(out.into_iter().flatten().collect())
    }

    /// Call `on_ready` with `(i, record)` for each `experts[i]` of `layer` as soon as it is available, so
    /// the caller computes with it while other reads finish, in as few calls as that allows: the hits
    /// together, then the misses in arrival order, each call with every read that completed during the
    /// one before (so that a caller computing in parallel enters its thread pool once per call, not once
    /// per record). A record is the caller's only during the call: after it, it may be evicted. Misses are
    /// read in parallel, as many at once as the budget has room for beside the records resident and in
    /// use, so the expert bytes in memory never exceed the budget, even for a prompt that needs more of a
    /// layer's experts than it holds.
    /// Arrival order varies: a caller that needs determinism combines the results afterwards in its own order.
    pub fn get_layer_with(
        &self,
        layer: usize,
        experts: &[u32],
        on_ready: &mut dyn FnMut(&Ready),
    ) -> Result<(), StoreError> {
        let keys: Vec<Key> = experts.iter().map(|&e| (layer, e as usize)).collect();
        self.fetch(&keys, true, on_ready)
    }

    /// Start reading `experts` of `layer` in the background unless resident, already in flight, or without
    /// room in the budget (a prefetch never waits); returns at once. The records land in the cache like
    /// any other.
    pub fn prefetch(&self, layer: usize, experts: &[u32]) -> Result<(), StoreError> {
        let mut issue = Vec::new();
        {
            let mut st = lock(&self.shared.state);
            for &e in experts {
                let key = (layer, e as usize);
                let size = self.size_of(key)?;
                if st.entries.contains_key(&key)
                    || st.in_flight.contains_key(&key)
                    || !st.make_room(size, self.shared.budget)
                {
                    continue;
                }
                st.issue(key, size, None, Issuer::Prefetch);
                st.layers[layer].prefetch_issued += 1;
                issue.push(key);
            }
        }
        for key in issue {
            self.submit(key, Urgency::Ahead);
        }
        Ok(())
    }

    /// If the budget holds every record of the store, read them all in the background and return true;
    /// else do nothing and return false. A model that nearly fits in memory then reaches its in-memory
    /// speed after one pass over the disk rather than after every expert has been asked for once — the
    /// disk idles between a layer's misses otherwise.
    ///
    /// The pass gives way to requests. It keeps up to half the I/O threads' worth of reads in flight, and
    /// issues none while a request waits for a read: several reads at once are what a disk needs to reach
    /// its speed (one at a time read 163–181 MB/s on a disk that reads 0.6–1.1 GB/s with eight), but on
    /// their own they delayed a prompt's reads and so the first token (measured on the 2-core Zen 3 EPYC:
    /// four at once without giving way took the first token from 22 to 29 s). A record already resident or
    /// in flight is skipped, and the warming never evicts. Its reads count as prefetches. It stops when the
    /// cache is dropped.
    pub fn warm(&self) -> Result<bool, StoreError> {
        let keys: Vec<Key> = self.shared.store.records().collect();
        let mut total = 0;
        for &k in &keys {
            total += self.size_of(k)?;
        }
        if total > self.shared.budget {
            return Ok(false);
        }
        let shared = Arc::downgrade(&self.shared);
        let pool = self.pool.submitter();
        std::thread::Builder::new()
            .name("titan-warm".into())
            .spawn(move || {
                for key in keys {
                    let Some(shared) = shared.upgrade() else { return };
                    match shared.begin_warming(key) {
                        None => return,
                        Some(false) => {}
                        Some(true) => {
                            let job = {
                                let shared = Arc::clone(&shared);
                                Box::new(move || shared.read_into_cache(key))
                            };
                            // Refused only when the pool has closed: the cache is gone.
                            if !pool.submit(job, Urgency::Background) {
                                return;
                            }
                        }
                    }
                }
            })
            .map_err(StoreError::io(self.shared.store.path()))?;
        Ok(true)
    }

    /// Load `experts` (layer, expert) and keep them resident for the life of the cache. They count in the
    /// budget, and must leave room in it for one more record, which streaming needs.
    pub fn pin(&self, experts: &[(usize, usize)]) -> Result<(), StoreError> {
        let mut keys = experts.to_vec();
        keys.sort_unstable();
        keys.dedup();
        for &k in &keys {
            self.check_key(k)?;
        }
        self.check_pin_budget(&lock(&self.shared.state), &keys)?;
        // Pinned as each arrives, while the request's claim still keeps it from eviction.
        self.fetch(&keys, false, &mut |ready| {
            let mut st = lock(&self.shared.state);
            for (_, rec) in ready {
                st.pin((rec.layer, rec.expert), Arc::clone(rec), self.shared.budget);
            }
        })
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
            in_flight_bytes: st.reserved,
            spare_bytes: st.spare,
            pinned_bytes: st.pinned,
            resident_records: st.entries.len(),
            total,
            layers: st.layers.clone(),
        }
    }

    fn size_of(&self, (layer, expert): Key) -> Result<u64, StoreError> {
        self.shared
            .store
            .record_bytes(layer, expert)
            .ok_or(StoreError::NoRecord { layer, expert })
    }

    fn check_key(&self, key: Key) -> Result<(), StoreError> {
        self.size_of(key).map(drop)
    }

    fn check_pin_budget(&self, st: &State, keys: &[Key]) -> Result<(), StoreError> {
        let store = &self.shared.store;
        let new: u64 = keys
            .iter()
            .filter(|k| !st.entries.get(k).is_some_and(|e| e.pinned))
            .filter_map(|&(l, e)| store.record_bytes(l, e))
            .sum();
        let need = st.pinned + new;
        let room = self.shared.budget - store.max_record_bytes();
        if need > room {
            return Err(StoreError::PinOverBudget { need, room });
        }
        Ok(())
    }

    /// The shared path of `get_layer_with` (`demand`: counted, recency updated) and `pin` (neither).
    fn fetch(&self, keys: &[Key], demand: bool, on_ready: &mut dyn FnMut(&Ready)) -> Result<(), StoreError> {
        let sizes = keys.iter().map(|&k| self.size_of(k)).collect::<Result<Vec<u64>, _>>()?;
        let shared = &*self.shared;
        let mut claims = Claims {
            shared,
            held: Vec::new(),
        };
        let (tx, rx) = mpsc::channel::<Arrival>();
        // Indexes not yet taken (no room for their read yet), how many reads this request awaits, and the
        // read id of each index's claim.
        let mut queued: Vec<usize> = (0..keys.len()).collect();
        let mut ids = vec![0u64; keys.len()];
        let mut awaited = 0usize;
        let mut stall = 0u64;
        loop {
            // Take whatever can be taken now: hits, reads in flight, misses that fit (the first pass issues
            // every miss that fits before the hits are computed, so reads run meanwhile).
            let mut here = Vec::new();
            let mut issue = Vec::new();
            {
                let mut st = lock(&shared.state);
                loop {
                    let mut still = Vec::new();
                    for &i in &queued {
                        match st.admit(keys[i], sizes[i], demand, shared, &mut claims, (i, &tx)) {
                            Admit::Here(rec, id) => {
                                ids[i] = id;
                                here.push((i, rec));
                            }
                            Admit::Coming(id, issued) => {
                                ids[i] = id;
                                awaited += 1;
                                if issued {
                                    issue.push(keys[i]);
                                }
                            }
                            Admit::NoRoom => still.push(i),
                        }
                    }
                    queued = still;
                    // Nothing taken, nothing coming, and no room: wait until another request or a read
                    // frees some (checked and waited under the same lock, so no wake-up is missed).
                    if queued.is_empty() || awaited > 0 || !here.is_empty() || !issue.is_empty() {
                        break;
                    }
                    let t = Instant::now();
                    st = shared.room.wait(st).unwrap_or_else(PoisonError::into_inner);
                    stall += t.elapsed().as_nanos() as u64;
                }
            }
            for key in issue {
                self.submit(key, Urgency::Demand);
            }
            hand_over(on_ready, here, &mut claims, keys, &ids);
            if awaited == 0 {
                if queued.is_empty() {
                    break;
                }
                continue;
            }
            let t = Instant::now();
            // Cannot fail while this request holds `tx`; every read it awaits completes and sends.
            let Ok(first) = rx.recv() else { break };
            stall += t.elapsed().as_nanos() as u64;
            let mut arrived = Vec::new();
            for (i, outcome) in std::iter::once(first).chain(rx.try_iter()) {
                awaited -= 1;
                match outcome {
                    Some(rec) => arrived.push((i, rec)),
                    None => {
                        // The read failed, ending every claim on it; read again here to get the error itself.
                        claims.forget(keys[i], ids[i]);
                        let rec = Arc::new(shared.store.read(keys[i].0, keys[i].1)?);
                        on_ready(&[(i, rec)]);
                    }
                }
            }
            hand_over(on_ready, arrived, &mut claims, keys, &ids);
        }
        if demand {
            if let Some(&(layer, _)) = keys.first() {
                lock(&shared.state).layers[layer].stall_ns += stall;
            }
        }
        Ok(())
    }

    fn submit(&self, key: Key, urgency: Urgency) {
        let shared = Arc::clone(&self.shared);
        self.pool.submit(Box::new(move || shared.read_into_cache(key)), urgency);
    }
}

impl Drop for ExpertCache {
    /// Stop the warming pass (it may be waiting for its turn) before the pool's workers are joined.
    fn drop(&mut self) {
        lock(&self.shared.state).closed = true;
        self.shared.room.notify_all();
    }
}

/// Hands `batch` (the records of `keys[i]`, claimed as `ids[i]`) to the request's callback, then ends
/// the request's claim on each; nothing when it is empty.
fn hand_over(
    on_ready: &mut dyn FnMut(&Ready),
    batch: Vec<(usize, Arc<ExpertRecord>)>,
    claims: &mut Claims,
    keys: &[Key],
    ids: &[u64],
) {
    if batch.is_empty() {
        return;
    }
    on_ready(&batch);
    for (i, rec) in batch {
        drop(rec);
        claims.release(keys[i], ids[i]);
    }
}

impl Shared {
    /// Wait for the warming pass's turn (fewer than `warm_depth` of its reads in flight, and none that a
    /// request is blocked on), then issue the warming read of `key` unless it is resident, in flight, or
    /// would not fit without evicting. Whether it issued the read; `None` once the cache is closing.
    fn begin_warming(&self, key: Key) -> Option<bool> {
        let size = self.store.record_bytes(key.0, key.1)?;
        let mut st = lock(&self.state);
        while !st.closed && !st.warming_may_issue(self.warm_depth) {
            st = self.room.wait(st).unwrap_or_else(PoisonError::into_inner);
        }
        if st.closed {
            return None;
        }
        if st.entries.contains_key(&key)
            || st.in_flight.contains_key(&key)
            || st.resident + st.reserved + st.spare + size > self.budget
        {
            return Some(false);
        }
        st.issue(key, size, None, Issuer::Warming);
        st.layers[key.0].prefetch_issued += 1;
        Some(true)
    }

    /// The I/O job: read one record; under the state lock, tell its waiters and make it resident in the
    /// room reserved for it, busy once for each waiter. The job's own reference moves into the cache, so
    /// no copy outlives the entry's eviction.
    fn read_into_cache(&self, key: Key) {
        let spare = lock(&self.state).in_flight.get_mut(&key).and_then(|f| f.buf.take());
        let t = Instant::now();
        let outcome = self.store.read_reusing(key.0, key.1, spare).ok().map(|mut rec| {
            if self.regroup {
                rec.regroup();
            }
            Arc::new(rec)
        });
        let ns = t.elapsed().as_nanos() as u64;
        let mut st = lock(&self.state);
        let c = &mut st.layers[key.0];
        c.read_ns += ns;
        c.bytes_read += outcome
            .as_ref()
            .map_or(0, |_| self.store.record_bytes(key.0, key.1).unwrap_or(0));
        if let Some(f) = st.in_flight.remove(&key) {
            st.reserved -= f.size;
            for (i, tx) in &f.waiters {
                // A send fails only if the request gave up (it returned an error); nothing to tell then.
                let _ = tx.send((*i, outcome.clone()));
            }
            if let Some(rec) = outcome {
                st.land(key, rec, &f, self.policy);
            }
        }
        drop(st);
        self.room.notify_all();
    }
}

impl State {
    fn rank(policy: Policy, uses: u64, tick: u64) -> (u64, u64) {
        match policy {
            Policy::Lru => (tick, 0),
            Policy::Lfu => (uses, tick),
        }
    }

    /// Take the record of `key` for a request, claiming it: resident, or in flight, or else its read issued
    /// here if the budget has room for it. The request is counted (when `demand`) once taken.
    fn admit(
        &mut self,
        key: Key,
        size: u64,
        demand: bool,
        shared: &Shared,
        claims: &mut Claims,
        waiter: (usize, &Sender<Arrival>),
    ) -> Admit {
        let c = &mut self.layers[key.0];
        if let Some(e) = self.entries.get_mut(&key) {
            if e.evictable() {
                self.order.remove(&(e.rank, key));
                self.evictable -= e.rec.resident_bytes();
            }
            e.busy += 1;
            if demand {
                self.tick += 1;
                e.uses += 1;
                e.rank = Self::rank(shared.policy, e.uses, self.tick);
                c.hits += 1;
                c.prefetch_used += u64::from(std::mem::take(&mut e.prefetched_unused));
            }
            claims.take(key, e.born);
            return Admit::Here(Arc::clone(&e.rec), e.born);
        }
        if let Some(f) = self.in_flight.get_mut(&key) {
            f.claims += 1;
            f.waiters.push((waiter.0, waiter.1.clone()));
            c.hits += u64::from(demand);
            c.prefetch_used += u64::from(demand && std::mem::take(&mut f.prefetch_unclaimed));
            claims.take(key, f.id);
            return Admit::Coming(f.id, false);
        }
        if !self.make_room(size, shared.budget) {
            return Admit::NoRoom;
        }
        self.layers[key.0].misses += u64::from(demand);
        let id = self.issue(key, size, Some(waiter), Issuer::Request);
        claims.take(key, id);
        Admit::Coming(id, true)
    }

    /// Reserve room for a read of `key` (`size` bytes, or a spare buffer that holds them, which it takes)
    /// and record it in flight, claimed by `waiter` if any; its id.
    fn issue(&mut self, key: Key, size: u64, waiter: Option<(usize, &Sender<Arrival>)>, by: Issuer) -> u64 {
        self.tick += 1;
        let buf = self.spare_for(size).map(|i| self.spares.swap_remove(i));
        let size = buf.as_ref().map_or(size, |b| {
            self.spare -= b.len() as u64;
            self.layers[key.0].buffers_reused += 1;
            b.len() as u64
        });
        let f = InFlight {
            waiters: waiter.map(|(i, tx)| (i, tx.clone())).into_iter().collect(),
            id: self.tick,
            size,
            buf,
            claims: u32::from(waiter.is_some()),
            prefetch_unclaimed: by != Issuer::Request,
            warming: by == Issuer::Warming,
        };
        self.in_flight.insert(key, f);
        self.reserved += size;
        self.tick
    }

    /// Whether the warming pass may issue a read: fewer than `depth` of its own in flight, and none that a
    /// request is blocked on.
    fn warming_may_issue(&self, depth: usize) -> bool {
        let mut warming = 0;
        for f in self.in_flight.values() {
            if !f.waiters.is_empty() {
                return false;
            }
            warming += usize::from(f.warming);
        }
        warming < depth
    }

    /// The spare buffer a read of `size` bytes would take.
    fn spare_for(&self, size: u64) -> Option<usize> {
        self.spares.iter().position(|b| b.len() as u64 >= size)
    }

    /// Make room in the budget, beside everything resident, in flight and spare, for a read of `size`
    /// bytes: free the spares it cannot use, then evict in policy order. A spare it can use is room
    /// already counted. False, changing nothing, when not even evicting every evictable record would do.
    fn make_room(&mut self, size: u64, budget: u64) -> bool {
        let fixed = self.resident - self.evictable + self.reserved;
        if fixed + size > budget {
            return false;
        }
        loop {
            let reuse = self.spare_for(size);
            let more = if reuse.is_some() { 0 } else { size };
            if self.resident + self.reserved + self.spare + more <= budget {
                return true;
            }
            // Every step frees a spare or an entry; an eviction may add a spare, freed or used next. With
            // nothing evictable and no spare left, `fixed + size` fits, as checked above.
            if let Some(j) = (0..self.spares.len()).find(|&j| Some(j) != reuse) {
                self.free_spare(j);
            } else if self.evict_one() {
            } else if let Some(i) = reuse {
                // The one spare it could use is longer than a fresh buffer and does not fit.
                self.free_spare(i);
            } else {
                return false; // not reached: nothing evictable and no spare leaves `fixed + size`, which fits
            }
        }
    }

    fn free_spare(&mut self, i: usize) {
        self.spare -= self.spares.swap_remove(i).len() as u64;
    }

    /// A finished read's record becomes an entry: busy for each claim on it, evictable if none.
    fn land(&mut self, key: Key, rec: Arc<ExpertRecord>, f: &InFlight, policy: Policy) {
        self.tick += 1;
        let size = rec.resident_bytes();
        let e = Entry {
            rec,
            rank: Self::rank(policy, 1, self.tick),
            uses: 1,
            pinned: false,
            busy: f.claims,
            born: f.id,
            prefetched_unused: f.prefetch_unclaimed,
        };
        if e.evictable() {
            self.order.insert((e.rank, key));
            self.evictable += size;
        }
        self.entries.insert(key, e);
        self.resident += size;
    }

    /// End one claim (on read `id` of `key`): the record, if it landed, is evictable again once unclaimed.
    fn release(&mut self, key: Key, id: u64) {
        if let Some(e) = self.entries.get_mut(&key).filter(|e| e.born == id && e.busy > 0) {
            e.busy -= 1;
            if e.evictable() {
                self.order.insert((e.rank, key));
                self.evictable += e.rec.resident_bytes();
            }
        } else if let Some(f) = self.in_flight.get_mut(&key).filter(|f| f.id == id) {
            f.claims = f.claims.saturating_sub(1);
        }
    }

    fn evict_one(&mut self) -> bool {
        let Some((_, key)) = self.order.pop_first() else {
            return false;
        };
        if let Some(e) = self.entries.remove(&key) {
            let size = e.rec.resident_bytes();
            self.resident -= size;
            self.evictable -= size;
            let c = &mut self.layers[key.0];
            c.evictions += 1;
            if e.prefetched_unused {
                c.prefetch_wasted += 1;
                c.prefetch_wasted_bytes += size;
            }
            // Unless a caller still holds the record (`get_layer`'s), its buffer becomes a spare.
            if let Ok(rec) = Arc::try_unwrap(e.rec) {
                self.spares.push(rec.into_buf());
                self.spare += size;
            }
        }
        true
    }

    /// Keep `rec` resident for good: it is normally an entry already, claimed by the pinning request; if
    /// not (a read retried after a failure), it is inserted, evicting unpinned records to make room.
    fn pin(&mut self, key: Key, rec: Arc<ExpertRecord>, budget: u64) {
        let size = rec.resident_bytes();
        match self.entries.get_mut(&key) {
            Some(e) if e.pinned => return,
            Some(e) => {
                if e.evictable() {
                    self.order.remove(&(e.rank, key));
                    self.evictable -= size;
                }
                e.pinned = true;
            }
            None => {
                while self.resident + self.reserved + size > budget && self.evict_one() {}
                // A rare path (a read retried after a failure): the spares its evictions made are freed.
                self.spares.clear();
                self.spare = 0;
                let e = Entry {
                    rec,
                    rank: (0, 0),
                    uses: 0,
                    pinned: true,
                    busy: 0,
                    born: 0,
                    prefetched_unused: false,
                };
                self.entries.insert(key, e);
                self.resident += size;
            }
        }
        self.pinned += size;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{convert_default, gguf_slice, test_dir, write_model, Spec};
    use crate::{Layout, Manifest, RecordSource, StoreOptions};
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
                regroup: false,
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
            matches!(err, StoreError::PinOverBudget { need, room } if need == 4 * S && room == 2 * S),
            "{err}"
        );
        assert!(matches!(
            c.pin(&[(0, 8)]),
            Err(StoreError::NoRecord { layer: 0, expert: 8 })
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
            let experts: Vec<u32> = (0..k).map(|_| (rng.next() % spec.n_expert as u64) as u32).collect();
            let recs = c.get_layer(layer, &experts).unwrap();
            for (rec, &e) in recs.iter().zip(&experts) {
                assert_eq!((rec.layer, rec.expert), (layer, e as usize));
                check_record(&f.gguf, rec);
            }
            requests[layer] += k as u64;
            let s = c.stats();
            assert!(
                s.resident_bytes + s.in_flight_bytes + s.spare_bytes <= s.budget_bytes,
                "{s:?}"
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
    fn warming_reads_every_record_when_the_budget_holds_them_all() {
        let f = fixture(&uniform(), true);
        // One record short of the whole store: nothing is read.
        let c = cache(&f, Budget::Bytes(15 * S), Policy::Lru);
        assert!(!c.warm().unwrap());
        assert_eq!(c.stats().total, Counters::default());
        let c = cache(&f, Budget::Bytes(16 * S), Policy::Lru);
        c.get_layer(1, &[5]).unwrap(); // resident before the warming starts: not read again
        assert!(!c.holds_every_record());
        assert!(c.warm().unwrap());
        let t0 = Instant::now();
        while resident(&c, 0, 8).len() + resident(&c, 1, 8).len() < 16 {
            assert!(t0.elapsed() < Duration::from_secs(10), "warming never finished");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(c.holds_every_record());
        for layer in 0..2 {
            c.get_layer(layer, &(0..8).collect::<Vec<u32>>())
                .unwrap()
                .iter()
                .for_each(|r| check_record(&f.gguf, r));
        }
        let s = c.stats();
        assert_eq!((s.total.prefetch_issued, s.total.prefetch_used), (15, 15));
        assert_eq!((s.total.hits, s.total.misses, s.total.evictions), (16, 1, 0));
        assert_eq!(s.total.bytes_read, 16 * S);
    }

    /// A record source that holds every read until the test lets it through, and counts the reads begun.
    #[derive(Clone, Default)]
    struct Gate(Arc<(Mutex<GateState>, Condvar)>);

    #[derive(Default)]
    struct GateState {
        begun: usize,
        /// Reads (by the order they began in) let through, or all of them.
        let_through: Vec<usize>,
        open: bool,
    }

    impl Gate {
        fn source(&self, file: &std::path::Path) -> impl RecordSource {
            (self.clone(), std::fs::File::open(file).unwrap())
        }

        fn begun(&self) -> usize {
            self.0 .0.lock().unwrap().begun
        }

        /// Wait until `n` reads have begun (within ten seconds), and check that no more have.
        fn wait_begun(&self, n: usize) {
            let t0 = Instant::now();
            while self.begun() < n {
                assert!(
                    t0.elapsed() < Duration::from_secs(10),
                    "{} reads begun, waiting for {n}",
                    self.begun()
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            // Time for an excess read to begin, were any going to.
            std::thread::sleep(Duration::from_millis(50));
            assert_eq!(self.begun(), n);
        }

        fn let_through(&self, reads: &[usize]) {
            self.0 .0.lock().unwrap().let_through.extend(reads);
            self.0 .1.notify_all();
        }

        fn open(&self) {
            self.0 .0.lock().unwrap().open = true;
            self.0 .1.notify_all();
        }
    }

    /// Opens the gate when dropped, so that a failing test unwinds instead of waiting forever for the I/O
    /// threads held in it.
    struct OpenOnDrop(Gate);

    impl Drop for OpenOnDrop {
        fn drop(&mut self) {
            self.0.open();
        }
    }

    impl RecordSource for (Gate, std::fs::File) {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
            let (state, cv) = &*self.0 .0;
            let mut g = state.lock().unwrap();
            let me = g.begun;
            g.begun += 1;
            while !g.open && !g.let_through.contains(&me) {
                g = cv.wait(g).unwrap();
            }
            drop(g);
            std::os::unix::fs::FileExt::read_at(&self.1, buf, offset)
        }
    }

    /// The warming pass keeps half the I/O threads' worth of reads in flight, and issues none while a
    /// request waits for a read.
    #[test]
    fn warming_gives_way_to_requests() {
        let f = fixture(&uniform(), false);
        let gate = Gate::default();
        let store = Store::open_with(f.store.path(), &f.gguf, &StoreOptions::default()).unwrap();
        let store = Arc::new(store.with_source(gate.source(f.store.file_path())));
        let opts = CacheOptions {
            io_threads: 4,
            ..CacheOptions::new(Budget::Bytes(16 * S))
        };
        let c = Arc::new(ExpertCache::new(store, &opts).unwrap());
        let _open = OpenOnDrop(gate.clone()); // dropped before the cache
        assert!(c.warm().unwrap());
        // Reads 0 and 1: the warming's first two records, and no more (a copy's record is one read).
        gate.wait_begun(2);
        let request = {
            let c = Arc::clone(&c);
            std::thread::spawn(move || c.get_layer(1, &[7]).map(|r| r[0].expert))
        };
        gate.wait_begun(3); // read 2, the request's, goes ahead of the warming's queue
        gate.let_through(&[0, 1]);
        while !(c.is_resident(0, 0) && c.is_resident(0, 1)) {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Its two reads landed, but the request still waits: the warming issues nothing.
        gate.wait_begun(3);
        gate.let_through(&[2]);
        assert_eq!(request.join().unwrap().unwrap(), 7);
        // Then it goes on, two at a time, to the end.
        gate.wait_begun(5);
        gate.open();
        let t0 = Instant::now();
        while resident(&c, 0, 8).len() + resident(&c, 1, 8).len() < 16 {
            assert!(t0.elapsed() < Duration::from_secs(10), "warming never finished");
            std::thread::sleep(Duration::from_millis(1));
        }
        let s = c.stats();
        assert_eq!(
            (s.total.prefetch_issued, s.total.misses, s.total.bytes_read),
            (15, 1, 16 * S)
        );
    }

    /// A cache that regroups its records gives the kernels views of the regroupable matrices (Q4_0 and
    /// Q8_0 rows of whole groups, where SIMD takes them) in that layout, and leaves the others plain; every
    /// matrix multiplies to the bits of the model's own bytes (NaNs aside, see below).
    #[test]
    fn regrouped_records_multiply_as_the_models_bytes() {
        use titan_kernels::{matmul, regrouped_weights_pay, Activations, WeightLayout, WeightView};
        let spec = Spec {
            n_layer: 2,
            dense: vec![],
            n_expert: 4,
            n_embd: 256,
            n_ff: 512,
            types: vec![
                [GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::F16],
                [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_0],
            ],
            seed: 5,
        };
        let f = fixture_of(&spec, false, Layout::InPlace);
        let c = ExpertCache::new(
            Arc::clone(&f.store),
            &CacheOptions {
                regroup: true,
                ..CacheOptions::new(Budget::Bytes(u64::MAX))
            },
        )
        .unwrap();
        let mut regrouped = 0;
        for layer in 0..2 {
            for rec in c.get_layer(layer, &[0, 1, 2, 3]).unwrap() {
                for (part, t) in [("gate", rec.gate()), ("up", rec.up()), ("down", rec.down())] {
                    let want = if t.ty != GgmlType::F16 && regrouped_weights_pay(t.ty) {
                        WeightLayout::Regrouped
                    } else {
                        WeightLayout::Plain
                    };
                    assert_eq!(t.layout, want, "{part} of ({layer}, {})", rec.expert);
                    regrouped += usize::from(want == WeightLayout::Regrouped);
                    let plain =
                        WeightView::new(t.ty, t.rows, t.cols, gguf_slice(&f.gguf, layer, rec.expert, part)).unwrap();
                    let x: Vec<f32> = (0..2 * t.cols)
                        .map(|i| ((i * 7919) % 263) as f32 / 131.0 - 1.0)
                        .collect();
                    let mut acts = Activations::new();
                    acts.quantize(t.ty.act_type(), &x, 2, t.cols).unwrap();
                    let (mut got, mut expected) = (vec![0f32; 2 * t.rows], vec![0f32; 2 * t.rows]);
                    matmul(&t.weight_view(), &acts, &mut got).unwrap();
                    matmul(&plain, &acts, &mut expected).unwrap();
                    // The records are random bytes, so some scales are NaN and so are their rows' outputs, on
                    // both paths; which NaN comes out is not part of the contract (Rust leaves NaN payloads
                    // unspecified: the compiler may swap an addition's operands), so any NaN matches any NaN.
                    let bits = |v: &[f32]| {
                        v.iter()
                            .map(|x| if x.is_nan() { f32::NAN.to_bits() } else { x.to_bits() })
                            .collect::<Vec<_>>()
                    };
                    assert_eq!(bits(&got), bits(&expected), "{part} of ({layer}, {})", rec.expert);
                }
            }
        }
        // On a CPU with SIMD, five of the six matrices of each record were regrouped.
        assert!(
            !regrouped_weights_pay(GgmlType::Q4_0) || regrouped == 4 * 5,
            "{regrouped}"
        );
    }

    #[test]
    fn prefetches_are_counted_when_issued_and_when_used() {
        let f = fixture(&uniform(), false);
        let c = cache(&f, Budget::Bytes(8 * S), Policy::Lru);
        c.prefetch(1, &[2, 3]).unwrap();
        c.prefetch(1, &[3]).unwrap(); // in flight or resident already: not issued again
        let t0 = Instant::now();
        while !(c.is_resident(1, 2) && c.is_resident(1, 3)) {
            assert!(t0.elapsed() < Duration::from_secs(10), "prefetch never landed");
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
            assert!(t0.elapsed() < Duration::from_secs(10), "prefetch never landed");
            std::thread::sleep(Duration::from_millis(1));
        }
        let s = c.stats();
        assert_eq!((s.layers[1].prefetch_issued, s.layers[1].prefetch_used), (2, 2));
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
        assert_eq!(s.total.bytes_read, (s.total.misses + s.total.prefetch_issued) * S);
        assert_eq!(s.total.prefetch_wasted, 0);
        // Six more of layer 0 fill the budget of eight; five of layer 1 then evict the oldest: 7 (read ahead
        // and used) and 6 (read ahead and never used: wasted).
        c.get_layer(0, &[0, 1, 2, 3, 4, 5]).unwrap();
        c.get_layer(1, &[0, 1, 5, 6, 7]).unwrap();
        let s = c.stats();
        assert!(!c.is_resident(0, 6) && !c.is_resident(0, 7));
        assert_eq!((s.layers[0].prefetch_wasted, s.layers[0].prefetch_wasted_bytes), (1, S));
        assert_eq!(s.layers[1].prefetch_wasted, 0);
    }

    /// Once the budget is full, each miss reads into the buffer of the record it evicted, and the bytes
    /// are the new record's.
    #[test]
    fn misses_read_into_the_buffers_of_evicted_records() {
        let f = fixture(&uniform(), true);
        let c = cache(&f, Budget::Bytes(3 * S), Policy::Lru);
        let mut buffers = Vec::new();
        // Addresses alone would not show it: a fresh mapping often lands where the last one was unmapped.
        for (n, e) in (0..8).chain(0..8).enumerate() {
            c.get_layer_with(n % 2, &[e], &mut |ready| {
                let [(_, rec)] = ready else {
                    panic!("{} records for one expert", ready.len())
                };
                check_record(&f.gguf, rec);
                let at = rec.gate().data.as_ptr() as usize;
                if buffers.len() < 3 {
                    buffers.push(at);
                } else {
                    assert!(buffers.contains(&at), "read {n} used a new buffer");
                }
            })
            .unwrap();
            let s = c.stats();
            assert_eq!(
                (s.resident_bytes, s.in_flight_bytes, s.spare_bytes),
                ((n as u64 + 1).min(3) * S, 0, 0)
            );
            assert_eq!(s.total.buffers_reused, n.saturating_sub(2) as u64);
        }
        assert_eq!(c.stats().total.evictions, 13);
    }

    #[test]
    fn get_layer_with_reports_the_hits_together_then_the_misses_as_they_arrive() {
        let f = fixture(&uniform(), false);
        let c = cache(&f, Budget::Bytes(8 * S), Policy::Lru);
        c.get_layer(0, &[1, 5]).unwrap();
        let mut calls = Vec::new();
        c.get_layer_with(0, &[4, 1, 6, 5, 1], &mut |ready| {
            calls.push(ready.iter().map(|(i, rec)| (*i, rec.expert)).collect::<Vec<_>>());
        })
        .unwrap();
        // The hits first, in one call and in request order; then the misses in whatever order and groups
        // they arrive.
        assert_eq!(calls[0], [(1, 1), (3, 5), (4, 1)]);
        assert!(calls[1..].iter().all(|c| !c.is_empty()), "{calls:?}");
        let mut seen: Vec<_> = calls.concat();
        seen.sort_unstable();
        assert_eq!(seen, vec![(0, 4), (1, 1), (2, 6), (3, 5), (4, 1)]);
    }

    /// A prompt asks for every expert of a layer at once, more than the budget holds: the records in
    /// memory (tracked through weak references to every record ever handed out) and the reads in flight
    /// stay within the budget at every step, with prefetches competing for the same room.
    #[test]
    fn the_budget_bounds_records_in_memory_and_in_flight() {
        let f = fixture(&uniform(), true);
        for budget in [2 * S, 3 * S, 5 * S] {
            let c = cache(&f, Budget::Bytes(budget), Policy::Lru);
            let mut seen: Vec<std::sync::Weak<ExpertRecord>> = Vec::new();
            let mut alive_max = 0u64;
            for round in 0..3u32 {
                for layer in 0..2 {
                    c.prefetch(1 - layer, &[round, round + 4]).unwrap();
                    let all: Vec<u32> = (0..8).map(|e| (e + round) % 8).collect();
                    let mut got = 0;
                    c.get_layer_with(layer, &all, &mut |ready| {
                        for (i, rec) in ready {
                            assert_eq!((rec.layer, rec.expert), (layer, all[*i] as usize));
                            check_record(&f.gguf, rec);
                            seen.push(Arc::downgrade(rec));
                        }
                        let alive = seen.iter().filter(|w| w.strong_count() > 0).count() as u64 * S;
                        let s = c.stats();
                        assert!(alive <= budget, "{alive} bytes of records alive, budget {budget}");
                        assert!(s.resident_bytes + s.in_flight_bytes + s.spare_bytes <= budget, "{s:?}");
                        alive_max = alive_max.max(alive);
                        got += ready.len();
                    })
                    .unwrap();
                    assert_eq!(got, 8);
                }
            }
            // The bound was reached, not merely respected by a cache that kept nothing.
            assert_eq!(alive_max, budget);
            let s = c.stats();
            assert!(s.total.misses > 0 && s.total.evictions > 0);
        }
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
        assert!(matches!(c.get_layer(1, &[3]), Err(StoreError::Digest { .. })));
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
