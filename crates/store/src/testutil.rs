//! Test models: small GGUFs with random expert bytes, written by `GgufWriter` to a real directory.

use std::path::{Path, PathBuf};

use titan_gguf::{GgufFile, GgufWriter, Value};
use titan_kernels::GgmlType;

/// A temporary directory beside the test binary, i.e. in the target dir on a real disk, where O_DIRECT
/// works (the system temp dir may be tmpfs, which refuses it).
pub fn test_dir() -> tempfile::TempDir {
    let exe = std::env::current_exe().unwrap();
    tempfile::Builder::new()
        .prefix("titan-store-test-")
        .tempdir_in(exe.parent().unwrap())
        .unwrap()
}

pub struct Spec {
    pub n_layer: usize,
    /// Layers with a dense FFN and no experts (as DeepSeek's first layers).
    pub dense: Vec<usize>,
    pub n_expert: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    /// gate, up, down types of each MoE layer, cycled.
    pub types: Vec<[GgmlType; 3]>,
    pub seed: u64,
}

impl Spec {
    /// Three layers (layer 0 dense), eight experts, Q4_K gate/up with Q6_K or Q4_K down as in Q4_K_M.
    pub fn q4_k_m() -> Spec {
        use GgmlType::*;
        Spec {
            n_layer: 3,
            dense: vec![0],
            n_expert: 8,
            n_embd: 256,
            n_ff: 512,
            types: vec![[Q4_K, Q4_K, Q6_K], [Q4_K, Q4_K, Q4_K]],
            seed: 1,
        }
    }

    /// Four MoE layers of small float and Q8_0 experts.
    pub fn mixed() -> Spec {
        use GgmlType::*;
        Spec {
            n_layer: 4,
            dense: vec![],
            n_expert: 6,
            n_embd: 64,
            n_ff: 96,
            types: vec![[Q8_0, F32, F16], [F32, Q8_0, Q8_0]],
            seed: 2,
        }
    }
}

pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        // xorshift64*: plenty for filling test tensors.
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| (self.next() >> 32) as u8).collect()
    }
}

/// Write the model described by `spec` to `dir/name` and open it.
pub fn write_model(dir: &Path, name: &str, spec: &Spec) -> GgufFile {
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("qwen3moe".into()));
    w.set("general.name", Value::String(format!("store test {}", spec.seed)));
    w.set("qwen3moe.block_count", Value::U32(spec.n_layer as u32));
    w.set("qwen3moe.expert_count", Value::U32(spec.n_expert as u32));
    let (d, f, n) = (spec.n_embd as u64, spec.n_ff as u64, spec.n_expert as u64);
    w.add_tensor("token_embd.weight", &[d, 16], GgmlType::F32).unwrap();
    let mut moe = 0;
    for l in 0..spec.n_layer {
        w.add_tensor(&format!("blk.{l}.attn_norm.weight"), &[d], GgmlType::F32)
            .unwrap();
        if spec.dense.contains(&l) {
            w.add_tensor(&format!("blk.{l}.ffn_up.weight"), &[d, f], GgmlType::F32)
                .unwrap();
            continue;
        }
        let [g, u, dn] = spec.types[moe % spec.types.len()];
        moe += 1;
        w.add_tensor(&format!("blk.{l}.ffn_gate_inp.weight"), &[d, n], GgmlType::F32)
            .unwrap();
        w.add_tensor(&format!("blk.{l}.ffn_gate_exps.weight"), &[d, f, n], g)
            .unwrap();
        w.add_tensor(&format!("blk.{l}.ffn_up_exps.weight"), &[d, f, n], u)
            .unwrap();
        w.add_tensor(&format!("blk.{l}.ffn_down_exps.weight"), &[f, d, n], dn)
            .unwrap();
    }
    let mut rng = Rng::new(spec.seed);
    let data: Vec<Vec<u8>> = w.tensor_sizes().map(|(_, size)| rng.bytes(size as usize)).collect();
    let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let path = dir.join(name);
    let mut file = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    w.write_all(&refs, &mut file).unwrap();
    drop(file);
    GgufFile::open(&path).unwrap()
}

/// The bytes of `part` ("gate", "up", "down") of one expert, straight from the GGUF.
pub fn gguf_slice<'a>(gguf: &'a GgufFile, layer: usize, expert: usize, part: &str) -> &'a [u8] {
    let t = gguf.tensor(&format!("blk.{layer}.ffn_{part}_exps.weight")).unwrap();
    let per = (t.size / t.dims[2]) as usize;
    &gguf.tensor_data(t)[expert * per..(expert + 1) * per]
}

/// Convert `gguf` into `dir/model.titan` with default options.
pub fn convert_default(gguf: &GgufFile, dir: &Path) -> PathBuf {
    let out = dir.join("model.titan");
    crate::convert(gguf, &out, &crate::ConvertOptions::default(), &mut |_, _| {}).unwrap();
    out
}
