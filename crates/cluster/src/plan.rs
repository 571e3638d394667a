//! Which node computes which expert. A plan lists, per layer and expert, the nodes that hold it —
//! the first is its primary, the others replicas used when the primary is down. Node `i` is the
//! `i`-th of `--nodes`; an expert no live node holds is computed by the backbone itself.

use std::fmt::Write as _;

use crate::slice::SliceSpec;
use crate::ClusterError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Contiguous ranges of expert ids, the same in every layer, sized by each node's budget.
    Contiguous,
    /// Expert `e` on node `e mod nodes`: hot neighbours land on different nodes.
    Interleaved,
}

impl std::str::FromStr for Placement {
    type Err = ClusterError;
    fn from_str(s: &str) -> Result<Self, ClusterError> {
        match s {
            "contiguous" => Ok(Placement::Contiguous),
            "interleaved" => Ok(Placement::Interleaved),
            _ => Err(ClusterError::UnknownPlacement(s.to_string())),
        }
    }
}

pub struct Plan {
    n_layer: usize,
    /// Layers 0..dense have no experts (DeepSeek's first layers): nobody holds anything there.
    dense: usize,
    n_expert: usize,
    /// owners[layer * n_expert + expert]: node indices, primary first.
    owners: Vec<Vec<usize>>,
}

impl Plan {
    /// Places `n_expert` experts of each of the layers dense..n_layer on nodes of the given budgets, each
    /// expert on `replicas` distinct nodes (the primary, then the next nodes in order).
    pub fn new(
        n_layer: usize,
        dense: usize,
        n_expert: usize,
        budgets: &[u64],
        placement: Placement,
        replicas: usize,
    ) -> Result<Plan, ClusterError> {
        let n = budgets.len();
        if n == 0 {
            return Err(ClusterError::NoNodes);
        }
        if replicas == 0 || replicas > n {
            return Err(ClusterError::Replicas { replicas, nodes: n });
        }
        let primary: Vec<usize> = match placement {
            Placement::Interleaved => (0..n_expert).map(|e| e % n).collect(),
            Placement::Contiguous => {
                // Boundaries at the budgets' running share, so a node with twice the budget gets twice
                // the experts; every budget counts as at least 1 so that zero budgets split evenly.
                let weights: Vec<u128> = budgets.iter().map(|&b| b.max(1) as u128).collect();
                let total: u128 = weights.iter().sum();
                let mut ends = Vec::with_capacity(n);
                let mut acc = 0u128;
                for w in &weights {
                    acc += w;
                    ends.push((acc * n_expert as u128 / total) as usize);
                }
                (0..n_expert)
                    .map(|e| ends.iter().position(|&end| e < end).unwrap_or(n - 1))
                    .collect()
            }
        };
        let per_layer: Vec<Vec<usize>> = primary
            .iter()
            .map(|&p| (0..replicas).map(|r| (p + r) % n).collect())
            .collect();
        let none = vec![Vec::new(); n_expert];
        let owners = (0..n_layer)
            .flat_map(|l| if l < dense { none.clone() } else { per_layer.clone() })
            .collect();
        Ok(Plan {
            n_layer,
            dense,
            n_expert,
            owners,
        })
    }

    /// The plan of nodes that hold fixed shards: each expert on the nodes whose shard holds it, in node
    /// order (`None`: the node holds the whole model and takes the experts no shard holds, evenly).
    pub fn from_holdings(n_layer: usize, dense: usize, n_expert: usize, holdings: &[Option<Vec<SliceSpec>>]) -> Plan {
        let whole: Vec<usize> = (0..holdings.len()).filter(|&n| holdings[n].is_none()).collect();
        let mut owners = Vec::with_capacity(n_layer * n_expert);
        for l in 0..n_layer {
            for e in 0..n_expert {
                let mut o: Vec<usize> = (0..holdings.len())
                    .filter(|&n| holdings[n].as_ref().is_some_and(|h| h.iter().any(|s| s.contains(l, e))))
                    .collect();
                if o.is_empty() && !whole.is_empty() && l >= dense {
                    o.push(whole[e % whole.len()]);
                }
                owners.push(o);
            }
        }
        Plan {
            n_layer,
            dense,
            n_expert,
            owners,
        }
    }

    /// Gives each of `hot` (layer, expert) a second copy, on the next node after its primary: the experts a
    /// routing profile shows busiest stay served when one node dies, and their load can be shared.
    pub fn replicate(&mut self, hot: &[(usize, usize)], n_nodes: usize) {
        for &(l, e) in hot {
            if l >= self.n_layer || e >= self.n_expert {
                continue;
            }
            let owners = &mut self.owners[l * self.n_expert + e];
            let Some(&primary) = owners.first() else { continue };
            if let Some(next) = (1..n_nodes)
                .map(|d| (primary + d) % n_nodes)
                .find(|n| !owners.contains(n))
            {
                owners.push(next);
            }
        }
    }

    /// Hands node `backbone`'s experts to the backbone itself: that index leaves every owner list, and an
    /// expert it alone held is computed by the backbone (which holds every expert). Planning with the
    /// backbone as one more node, then this, gives it a share of the experts sized like any node's.
    pub fn give_to_backbone(&mut self, backbone: usize) {
        for owners in &mut self.owners {
            if owners.first() == Some(&backbone) {
                // Its primary: the backbone computes it, and needs no replica to fail over to.
                owners.clear();
            } else {
                owners.retain(|&n| n != backbone);
            }
        }
    }

    /// The nodes holding `expert` of `layer`, primary first. None for a layer past the plan's (the MTP block
    /// after the main ones): the backbone computes those.
    pub fn owners(&self, layer: usize, expert: usize) -> &[usize] {
        if layer >= self.n_layer {
            return &[];
        }
        &self.owners[layer * self.n_expert + expert]
    }

    /// Per node, the experts it serves (primary or replica) as id ranges, e.g. "0-31, 96-127", per run
    /// of layers that share them.
    pub fn describe(&self, nodes: &[String]) -> String {
        let mut out = String::new();
        for (i, name) in nodes.iter().enumerate() {
            let held =
                |l: usize| -> Vec<usize> { (0..self.n_expert).filter(|&e| self.owners(l, e).contains(&i)).collect() };
            let mut parts = Vec::new();
            let mut first = self.dense;
            for l in self.dense + 1..=self.n_layer {
                if l == self.n_layer || held(l) != held(first) {
                    let which = if first == 0 && l == self.n_layer {
                        format!("each of {} layers", self.n_layer)
                    } else {
                        format!("layers {}", ranges(&(first..l).collect::<Vec<_>>()))
                    };
                    let h = held(first);
                    if !h.is_empty() {
                        parts.push(format!("experts {} of {which}", ranges(&h)));
                    }
                    first = l;
                }
            }
            let total = (self.n_layer - self.dense) * self.n_expert;
            let primary = (0..self.n_layer)
                .flat_map(|l| (0..self.n_expert).map(move |e| (l, e)))
                .filter(|&(l, e)| self.owners(l, e).first() == Some(&i))
                .count();
            let _ = writeln!(
                out,
                "  node {i} {name}: {} (first choice for {primary} of the {total} layer × expert pairs)",
                if parts.is_empty() {
                    "nothing".into()
                } else {
                    parts.join("; ")
                }
            );
        }
        let orphans = self.owners[self.dense * self.n_expert..]
            .iter()
            .filter(|o| o.is_empty())
            .count();
        if orphans > 0 {
            let _ = writeln!(
                out,
                "  backbone: computes the {orphans} layer × expert pairs no node holds"
            );
        }
        out
    }
}

/// [0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8".
fn ranges(ids: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < ids.len() {
        let mut j = i;
        while j + 1 < ids.len() && ids[j + 1] == ids[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            ids[i].to_string()
        } else {
            format!("{}-{}", ids[i], ids[j])
        });
        i = j + 1;
    }
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_follows_budgets() {
        let p = Plan::new(2, 0, 8, &[1, 1, 2], Placement::Contiguous, 1).unwrap();
        let primaries: Vec<usize> = (0..8).map(|e| p.owners(1, e)[0]).collect();
        assert_eq!(primaries, [0, 0, 1, 1, 2, 2, 2, 2]);
        let even = Plan::new(1, 0, 8, &[0, 0, 0], Placement::Contiguous, 1).unwrap();
        assert_eq!(
            (0..8).map(|e| even.owners(0, e)[0]).collect::<Vec<_>>(),
            [0, 0, 1, 1, 1, 2, 2, 2]
        );
    }

    #[test]
    fn interleaved_with_replicas() {
        let p = Plan::new(1, 0, 5, &[1, 1], Placement::Interleaved, 2).unwrap();
        assert_eq!(p.owners(0, 0), [0, 1]);
        assert_eq!(p.owners(0, 3), [1, 0]);
        assert!(p
            .describe(&["a".into(), "b".into()])
            .contains("experts 0-4 of each of 1 layers"));
        assert!(Plan::new(1, 0, 5, &[1, 1], Placement::Interleaved, 3).is_err());
    }

    #[test]
    fn hot_experts_get_a_second_node() {
        let mut p = Plan::new(2, 0, 4, &[1, 1, 1], Placement::Contiguous, 1).unwrap();
        p.replicate(&[(0, 0), (1, 3), (1, 9)], 3);
        assert_eq!(p.owners(0, 0), [0, 1]);
        assert_eq!(p.owners(1, 3), [2, 0]);
        assert_eq!(p.owners(0, 3), [2]);
        let mut one = Plan::new(1, 0, 2, &[1], Placement::Contiguous, 1).unwrap();
        one.replicate(&[(0, 0)], 1);
        assert_eq!(one.owners(0, 0), [0], "no second node to copy to");
    }

    #[test]
    fn shards_place_what_they_hold() {
        let spec = |layers, experts| vec![SliceSpec { layers, experts }];
        let p = Plan::from_holdings(2, 0, 4, &[Some(spec(0..=1, 0..=1)), Some(spec(0..=0, 2..=3)), None]);
        assert_eq!(p.owners(0, 1), [0]);
        assert_eq!(p.owners(0, 3), [1]);
        assert_eq!(p.owners(1, 3), [2], "no shard holds it: the whole-model node");
        let text = p.describe(&["a".into(), "b".into(), "c".into()]);
        assert!(text.contains("b: experts 2-3 of layers 0 "), "{text}");
        let none = Plan::from_holdings(1, 0, 2, &[Some(spec(0..=0, 0..=0))]);
        assert!(none.owners(0, 1).is_empty());
        assert!(none
            .describe(&["a".into()])
            .contains("backbone: computes the 1 layer × expert pairs"));
    }

    #[test]
    fn id_ranges() {
        assert_eq!(ranges(&[0, 1, 2, 5, 7, 8]), "0-2, 5, 7-8");
        assert_eq!(ranges(&[]), "none");
    }

    /// The backbone planned as one more node: its share leaves the owner lists, the nodes keep theirs.
    #[test]
    fn the_backbone_takes_a_share_like_a_node() {
        let mut p = Plan::new(2, 0, 8, &[1, 1, 1, 1], Placement::Contiguous, 1).unwrap();
        p.give_to_backbone(3);
        assert_eq!((p.owners(0, 0), p.owners(1, 5)), (&[0][..], &[2][..]));
        assert!((6..8).all(|e| p.owners(0, e).is_empty() && p.owners(1, e).is_empty()));
        let text = p.describe(&["a".into(), "b".into(), "c".into()]);
        assert!(
            text.contains("backbone: computes the 4 layer × expert pairs no node holds"),
            "{text}"
        );
    }

    /// Dense layers (no experts) are nobody's: no owners, not described, not counted for the backbone.
    #[test]
    fn dense_layers_are_held_by_no_node() {
        let p = Plan::new(3, 1, 4, &[1, 1], Placement::Contiguous, 1).unwrap();
        assert!((0..4).all(|e| p.owners(0, e).is_empty()));
        assert_eq!((p.owners(1, 0), p.owners(2, 3)), (&[0][..], &[1][..]));
        let text = p.describe(&["a".into(), "b".into()]);
        assert!(
            text.contains("a: experts 0-1 of layers 1-2 (first choice for 4 of the 8 layer × expert pairs)")
                && !text.contains("backbone"),
            "{text}"
        );
    }
}
