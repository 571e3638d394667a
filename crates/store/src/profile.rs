//! A routing profile: how often each (layer, expert) was chosen over a run, saved as JSON, used to pick the
//! experts worth pinning.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::StoreError;

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

    pub fn save(&self, path: &Path) -> Result<(), StoreError> {
        let json = serde_json::to_vec(self).map_err(|e| StoreError::Profile {
            path: path.to_path_buf(),
            what: e.to_string(),
        })?;
        std::fs::write(path, json).map_err(StoreError::io(path))
    }

    pub fn load(path: &Path) -> Result<Profile, StoreError> {
        let text = std::fs::read(path).map_err(StoreError::io(path))?;
        serde_json::from_slice(&text).map_err(|e| StoreError::Profile {
            path: path.to_path_buf(),
            what: format!("not a routing profile: {e}"),
        })
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
    }
}
