//! Shared by the integration tests: the committed oracle fixtures (tests/fixtures, made by
//! tools/make_fixtures.py from transformers and llama.cpp) and a reader for their .npy files.

#![allow(dead_code)]

use std::path::PathBuf;

use serde_json::Value;

/// One model file per architecture, and the K-quant models (every file of a model shares its code paths but
/// not its kernels, so take a few types too).
pub const ONE_PER_ARCHITECTURE: &[&str] = &[
    "qwen3moe/q4_0.gguf",
    "olmoe/q8_0.gguf",
    "qwen2moe/f16.gguf",
    "mixtral/q5_1.gguf",
    "qwen3moe-k/q4_k_m.gguf",
    "qwen3next/q8_0.gguf",
    "qwen35moe/q4_0.gguf",
    "qwen35moe-k/q6_k.gguf",
    "deepseek3/q8_0.gguf",
    "deepseek2-lite/q4_0.gguf",
    "gpt-oss/mxfp4_moe.gguf",
    "qwen35/q4_0.gguf",
    "glm4moe/q4_0.gguf",
    "minimax-m2/q8_0.gguf",
    "llama4/q4_0.gguf",
    "deepseek4/mxfp4_moe.gguf",
];

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

pub fn manifest() -> Value {
    let p = fixtures().join("manifest.json");
    let text =
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e} (run tools/make_fixtures.sh)", p.display()));
    serde_json::from_str(&text).expect("manifest.json parses")
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("an array of ids")
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

/// A float32 .npy file: (shape, data).
pub fn read_npy(rel: &str) -> (Vec<usize>, Vec<f32>) {
    let p = fixtures().join(rel);
    let b = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    assert_eq!(&b[..6], b"\x93NUMPY", "{} is not a .npy file", p.display());
    let (hlen, start) = match b[6] {
        1 => (u16::from_le_bytes([b[8], b[9]]) as usize, 10),
        _ => (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12),
    };
    let header = std::str::from_utf8(&b[start..start + hlen]).unwrap();
    assert!(
        header.contains("'<f4'"),
        "{}: expected float32, header {header}",
        p.display()
    );
    assert!(header.contains("'fortran_order': False"));
    let shape_str = header.split("'shape': (").nth(1).unwrap().split(')').next().unwrap();
    let shape: Vec<usize> = shape_str
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse().unwrap())
        .collect();
    let data: Vec<f32> = b[start + hlen..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(data.len(), shape.iter().product::<usize>(), "{}: size", p.display());
    (shape, data)
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

pub fn rms_diff(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    (a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum::<f64>() / a.len() as f64).sqrt()
}

/// Top-1 minus top-2 logit of one row.
pub fn margin(row: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in row {
        if v > a {
            b = a;
            a = v;
        } else if v > b {
            b = v;
        }
    }
    a - b
}
