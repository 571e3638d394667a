//! Experts streamed from the store: the engine's expert seam over the bounded cache. A layer's misses are
//! read together, and the experts are computed as soon as their records are here — the hits in one batch,
//! then each group of reads that completed meanwhile in another. Biases and the activation stay resident.

use std::sync::Arc;

use titan_engine::experts::{ExpertJob, ExpertScratch, ExpertWeights, Experts, ScratchPool};
use titan_engine::samples::Sample;
use titan_engine::weights::ExpertExtras;
use titan_engine::EngineError;
use titan_kernels::GgmlType;

use crate::units::human_bytes;
use crate::{ExpertCache, StoreError};

pub struct StreamedExperts {
    cache: ExpertCache,
    extras: Arc<ExpertExtras>,
    /// Per layer, the activation format its experts take (none for a dense layer).
    input_types: Vec<Option<GgmlType>>,
    /// Read ahead the experts the forward pass says the next layer will probably choose.
    prefetch: bool,
    scratch: ScratchPool<ExpertScratch>,
}

impl StreamedExperts {
    pub fn new(cache: ExpertCache, extras: Arc<ExpertExtras>, prefetch: bool) -> StreamedExperts {
        let store = cache.store();
        let mut input_types = vec![None; store.n_layer()];
        for l in store.layers() {
            input_types[l.layer] = l.gate.ggml_type().map(GgmlType::act_type);
        }
        StreamedExperts {
            cache,
            extras,
            input_types,
            prefetch,
            scratch: ScratchPool::default(),
        }
    }

    pub fn cache(&self) -> &ExpertCache {
        &self.cache
    }
}

fn engine_error(e: StoreError) -> EngineError {
    EngineError::Experts(Box::new(e))
}

impl Experts for StreamedExperts {
    fn input_type(&self, layer: usize) -> Result<GgmlType, EngineError> {
        self.input_types
            .get(layer)
            .copied()
            .flatten()
            .ok_or_else(|| engine_error(StoreError::NoRecord { layer, expert: 0 }))
    }

    fn apply(
        &self,
        job: &ExpertJob,
        meanwhile: &mut dyn FnMut() -> Result<(), EngineError>,
        deliver: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), EngineError> {
        meanwhile()?;
        let layer = job.layer;
        self.scratch.with(|s| {
            // The callback cannot return an error to the cache; keep the first one and stop computing.
            let mut failed = None;
            self.cache
                .get_layer_with(layer, job.ids, &mut |ready| {
                    if failed.is_some() {
                        return;
                    }
                    let batch = ready.iter().map(|(i, rec)| {
                        let e = job.ids[*i] as usize;
                        let w = ExpertWeights {
                            gate: rec.gate().weight_view(),
                            up: rec.up().weight_view(),
                            down: rec.down().weight_view(),
                            bias: self.extras.bias(layer, e),
                            act: self.extras.act,
                        };
                        (*i, w)
                    });
                    if let Err(e) = s.compute(job, batch, deliver) {
                        failed = Some(e);
                    }
                })
                .map_err(engine_error)?;
            failed.map_or(Ok(()), Err)
        })
    }

    /// Once every record is resident (a budget the warming has filled) a request can only hit: reading
    /// ahead, and routing ahead to know what to read, would be wasted work.
    fn wants_hints(&self, _layer: usize) -> bool {
        self.prefetch && !self.cache.holds_every_record()
    }

    fn hint(&self, layer: usize, ids: &[u32]) -> Result<(), EngineError> {
        self.cache.prefetch(layer, ids).map_err(engine_error)
    }

    fn samples(&self, out: &mut Vec<Sample>) {
        let s = self.cache.stats();
        let t = &s.total;
        let secs = |ns: u64| ns as f64 / 1e9;
        out.extend([
            Sample::counter(
                "expert_cache_hits_total",
                "Expert records found in the cache.",
                t.hits as f64,
            ),
            Sample::counter(
                "expert_cache_misses_total",
                "Expert records read from the store.",
                t.misses as f64,
            ),
            Sample::counter(
                "expert_cache_read_bytes_total",
                "Bytes read from the store (misses, prefetches, pins, warming).",
                t.bytes_read as f64,
            ),
            Sample::counter(
                "expert_cache_read_seconds_total",
                "Time the store's reads took.",
                secs(t.read_ns),
            ),
            Sample::counter(
                "expert_cache_stall_seconds_total",
                "Time the forward pass waited for reads.",
                secs(t.stall_ns),
            ),
            Sample::counter(
                "expert_cache_prefetches_total",
                "Records read ahead of being asked for.",
                t.prefetch_issued as f64,
            ),
            Sample::counter(
                "expert_cache_prefetches_used_total",
                "Records read ahead that a request found.",
                t.prefetch_used as f64,
            ),
            Sample::counter(
                "expert_cache_prefetches_wasted_total",
                "Records read ahead and evicted before a request found them.",
                t.prefetch_wasted as f64,
            ),
            Sample::counter(
                "expert_cache_prefetch_wasted_bytes_total",
                "Bytes of the records read ahead and evicted unused.",
                t.prefetch_wasted_bytes as f64,
            ),
            Sample::counter("expert_cache_evictions_total", "Records evicted.", t.evictions as f64),
            Sample::gauge(
                "expert_cache_budget_bytes",
                "Most bytes of expert records held.",
                s.budget_bytes as f64,
            ),
            Sample::gauge(
                "expert_cache_resident_bytes",
                "Bytes of expert records held.",
                s.resident_bytes as f64,
            ),
            Sample::gauge(
                "expert_cache_resident_records",
                "Expert records held.",
                s.resident_records as f64,
            ),
        ]);
    }

    fn summary(&self) -> Option<String> {
        let s = self.cache.stats();
        let t = &s.total;
        Some(format!(
            "experts: budget {}, hit rate {:.1}% ({} hits, {} misses), {} read in {:.2} s, stalled {:.2} s, \
             prefetch {} issued / {} used / {} evicted unused ({})\n",
            human_bytes(s.budget_bytes),
            100.0 * t.hit_rate(),
            t.hits,
            t.misses,
            human_bytes(t.bytes_read),
            t.read_ns as f64 / 1e9,
            t.stall_ns as f64 / 1e9,
            t.prefetch_issued,
            t.prefetch_used,
            t.prefetch_wasted,
            human_bytes(t.prefetch_wasted_bytes)
        ))
    }
}
