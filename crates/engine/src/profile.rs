//! A routing profile: how often each (layer, expert) was chosen over a run, saved as JSON, used to pick the
//! experts worth pinning (the store) or replicating (the cluster); and what a run's routing looked like
//! layer by layer (`titan profile`).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::generate::GenerateOptions;
use crate::trace::Trace;
use crate::{EngineError, Model, Result};

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Profile {
    /// `counts[layer][expert]`: times the router chose that expert for a token row.
    pub counts: Vec<Vec<u64>>,
}

impl Profile {
    pub fn new(n_layer: usize, n_expert: usize) -> Profile {
        Profile {
            counts: vec![vec![0; n_expert]; n_layer],
        }
    }

    /// Count one routing decision: `experts` chosen in `layer`. Ids outside the profile's shape are ignored
    /// (the profile was sized from the same model the router runs).
    pub fn record(&mut self, layer: usize, experts: &[u32]) {
        if let Some(row) = self.counts.get_mut(layer) {
            for &e in experts {
                if let Some(c) = row.get_mut(e as usize) {
                    *c += 1;
                }
            }
        }
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        let bad = |what: String| EngineError::Model {
            path: path.display().to_string(),
            what,
        };
        let json = serde_json::to_vec(self).map_err(|e| bad(e.to_string()))?;
        std::fs::write(path, json).map_err(|e| bad(e.to_string()))
    }

    pub fn load(path: &Path) -> Result<Profile> {
        let bad = |what: String| EngineError::Model {
            path: path.display().to_string(),
            what,
        };
        let text = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
        serde_json::from_slice(&text).map_err(|e| bad(format!("not a routing profile: {e}")))
    }

    /// The profile of a model of `n_layer` layers of `n_expert` experts, or why it is another model's.
    pub fn check_shape(&self, path: &Path, n_layer: usize, n_expert: usize) -> Result<()> {
        if self.counts.len() != n_layer || self.counts.iter().any(|r| r.len() != n_expert) {
            return Err(EngineError::Model {
                path: path.display().to_string(),
                what: format!(
                    "a profile of another model ({} layers; this one has {n_layer} of {n_expert} experts)",
                    self.counts.len()
                ),
            });
        }
        Ok(())
    }

    /// The most often chosen `share` of each layer's experts (rounded up), hottest first; experts never
    /// chosen are left out.
    pub fn hottest_share(&self, share: f64) -> Vec<(usize, usize)> {
        let mut hot = Vec::new();
        for (l, counts) in self.counts.iter().enumerate() {
            let n_expert = counts.len();
            let per_layer = ((n_expert as f64 * share.clamp(0.0, 1.0)).ceil() as usize).min(n_expert);
            let mut order: Vec<usize> = (0..n_expert).filter(|&e| counts[e] > 0).collect();
            order.sort_by(|&a, &b| counts[b].cmp(&counts[a]).then(a.cmp(&b)));
            hot.extend(order.into_iter().take(per_layer).map(|e| (l, e)));
        }
        hot
    }

    /// The most often chosen (layer, expert)s whose records fit in `budget_bytes` together: by count,
    /// highest first (ties by layer, then expert), skipping any that no longer fit; never-chosen experts
    /// and those `record_size_of` does not know (dense layers) are left out.
    pub fn hottest(
        &self,
        budget_bytes: u64,
        record_size_of: impl Fn(usize, usize) -> Option<u64>,
    ) -> Vec<(usize, usize)> {
        let mut all: Vec<(u64, usize, usize)> = self
            .counts
            .iter()
            .enumerate()
            .flat_map(|(l, row)| {
                row.iter()
                    .enumerate()
                    .filter(|(_, &c)| c > 0)
                    .map(move |(e, &c)| (c, l, e))
            })
            .collect();
        all.sort_by(|a, b| b.0.cmp(&a.0).then((a.1, a.2).cmp(&(b.1, b.2))));
        let mut left = budget_bytes;
        let mut out = Vec::new();
        for (_, l, e) in all {
            if let Some(size) = record_size_of(l, e).filter(|&s| s <= left) {
                left -= size;
                out.push((l, e));
            }
        }
        out
    }
}

/// What a run's routing looked like: its profile, and per layer how many experts it used, how
/// concentrated the choice was and how much consecutive tokens' choices overlapped.
pub struct RoutingReport {
    pub profile: Profile,
    /// Token rows routed (the prompt's and each generated token's).
    pub tokens: usize,
    /// One per layer; a dense layer routes nothing and has zeros.
    pub layers: Vec<LayerRouting>,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct LayerRouting {
    /// Distinct experts chosen at least once.
    pub used: usize,
    /// The most chosen expert's share of the layer's choices.
    pub hottest_share: f64,
    /// The mean share of a token's experts that the token before it also chose.
    pub overlap: f64,
}

impl Model {
    /// Generates from `prompt` as [`Model::generate`] does and reports how it routed. The trace of the
    /// run already records every routing decision; this counts them.
    pub fn profile_routing(&self, prompt: &[u32], opts: &GenerateOptions) -> Result<RoutingReport> {
        let mut t = Trace::default();
        self.generate_traced(prompt, opts, Some(&mut t), |_| {})?;
        let (n_layer, n_expert, k) = (self.config.n_layer, self.config.n_expert, self.config.n_expert_used);
        let mut profile = Profile::new(n_layer, n_expert);
        // Per layer, every token's chosen experts in order (prompt rows, then each generated token).
        let mut per_layer: Vec<Vec<u32>> = vec![Vec::new(); n_layer];
        for r in &t.records {
            if let Some((_, Some(layer), "topk_ids")) = r.place() {
                let ids: Vec<u32> = r.u32s().collect();
                profile.record(layer, &ids);
                if let Some(all) = per_layer.get_mut(layer) {
                    all.extend(ids);
                }
            }
        }
        let layers = per_layer.iter().map(|ids| layer_routing(ids, n_expert, k)).collect();
        let tokens = per_layer.iter().map(|ids| ids.len() / k.max(1)).max().unwrap_or(0);
        Ok(RoutingReport {
            profile,
            tokens,
            layers,
        })
    }
}

/// The statistics of one layer's choices, `k` per token, tokens in order.
fn layer_routing(ids: &[u32], n_expert: usize, k: usize) -> LayerRouting {
    if ids.is_empty() || k == 0 {
        return LayerRouting::default();
    }
    let mut counts = vec![0usize; n_expert];
    for &e in ids {
        if let Some(c) = counts.get_mut(e as usize) {
            *c += 1;
        }
    }
    let rows: Vec<&[u32]> = ids.chunks_exact(k).collect();
    let overlap: f64 = rows
        .windows(2)
        .map(|w| w[1].iter().filter(|e| w[0].contains(e)).count() as f64 / k as f64)
        .sum();
    LayerRouting {
        used: counts.iter().filter(|&&c| c > 0).count(),
        hottest_share: *counts.iter().max().unwrap_or(&0) as f64 / ids.len() as f64,
        overlap: overlap / rows.len().saturating_sub(1).max(1) as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hottest_fills_the_budget_by_count_and_round_trips() {
        let mut p = Profile::new(2, 4);
        for _ in 0..5 {
            p.record(1, &[2, 3]);
        }
        p.record(0, &[0, 3, 9]); // 9 is out of range: ignored
        p.record(1, &[3]);
        p.record(7, &[0]); // no layer 7: ignored
        assert_eq!(p.counts, vec![vec![1, 0, 0, 1], vec![0, 0, 5, 6]]);
        let size = |l: usize, _e: usize| if l == 0 { Some(100) } else { Some(250) };
        assert_eq!(p.hottest(1000, size), vec![(1, 3), (1, 2), (0, 0), (0, 3)]);
        // 600 holds both layer-1 experts (500), then only one 100-byte record.
        assert_eq!(p.hottest(600, size), vec![(1, 3), (1, 2), (0, 0)]);
        // A record too big to fit is skipped, smaller ones after it still go in.
        assert_eq!(p.hottest(200, size), vec![(0, 0), (0, 3)]);
        assert_eq!(p.hottest(1000, |l, _| (l == 0).then_some(10)), vec![(0, 0), (0, 3)]);

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("profile.json");
        p.save(&path).unwrap();
        assert_eq!(Profile::load(&path).unwrap(), p);
        std::fs::write(&path, b"{\"counts\": 3}").unwrap();
        let err = Profile::load(&path).unwrap_err().to_string();
        assert!(err.contains("profile.json: not a routing profile"), "{err}");
        assert_eq!(p.hottest_share(0.25), vec![(0, 0), (1, 3)]);
        assert_eq!(p.hottest_share(0.5), vec![(0, 0), (0, 3), (1, 3), (1, 2)]);
        assert!(p.check_shape(&path, 2, 4).is_ok() && p.check_shape(&path, 2, 5).is_err());
    }

    /// Two tokens of top-2 over 4 experts: {0, 1} then {1, 3}.
    #[test]
    fn layer_statistics() {
        let r = layer_routing(&[0, 1, 1, 3], 4, 2);
        assert_eq!(r.used, 3);
        assert_eq!(r.hottest_share, 0.5);
        assert_eq!(r.overlap, 0.5);
        assert_eq!(layer_routing(&[], 4, 2).used, 0);
    }
}
