//! The names llama.cpp gives expert tensors.

/// One of an expert's three matrices: `down(silu(gate(x)) · up(x))`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Part {
    Gate,
    Up,
    Down,
}

impl Part {
    /// In the order the store's records, digests and shards hold them.
    pub const ALL: [Part; 3] = [Part::Gate, Part::Up, Part::Down];

    pub fn name(self) -> &'static str {
        match self {
            Part::Gate => "gate",
            Part::Up => "up",
            Part::Down => "down",
        }
    }
}

/// `blk.L.ffn_{gate,up,down}_exps.weight`: the stacked matrices of layer `layer`'s experts.
pub fn weight_name(layer: usize, part: Part) -> String {
    format!("blk.{layer}.ffn_{}_exps.weight", part.name())
}

/// `blk.L.ffn_{gate,up,down}_exps.bias`: one bias row per expert (gpt-oss).
pub fn bias_name(layer: usize, part: Part) -> String {
    format!("blk.{layer}.ffn_{}_exps.bias", part.name())
}

/// Whether a tensor holds experts (their stacked matrices or their biases).
pub fn is_expert_tensor(name: &str) -> bool {
    name.contains("_exps.")
}

/// The block a tensor belongs to (`blk.N.…`) and the rest of its name, if it belongs to one.
pub fn split_block(name: &str) -> Option<(usize, &str)> {
    let (block, rest) = name.strip_prefix("blk.")?.split_once('.')?;
    Some((block.parse().ok()?, rest))
}

/// The layer and part of an expert weight tensor's name, if it is one.
pub fn parse_weight_name(name: &str) -> Option<(usize, Part)> {
    let (layer, rest) = split_block(name)?;
    let part = Part::ALL
        .into_iter()
        .find(|p| rest == format!("ffn_{}_exps.weight", p.name()))?;
    Some((layer, part))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for part in Part::ALL {
            assert_eq!(parse_weight_name(&weight_name(17, part)), Some((17, part)));
            assert!(is_expert_tensor(&weight_name(17, part)) && is_expert_tensor(&bias_name(3, part)));
        }
        assert_eq!(parse_weight_name("blk.3.ffn_gate_exps.bias"), None);
        assert_eq!(parse_weight_name("blk.x.ffn_gate_exps.weight"), None);
        assert_eq!(parse_weight_name("blk.3.ffn_gate_shexp.weight"), None);
        assert!(!is_expert_tensor("blk.0.ffn_gate_shexp.weight"));
    }
}
