//! The writer: metadata and tensors in, a version-3 GGUF out. Used by `titan synth`, by tests that need
//! damaged files, and anywhere TITAN writes a model.

use std::io::{self, Write};

use titan_kernels::GgmlType;

use crate::reader::{align_up, tensor_size};
use crate::value::Value;
use crate::{DEFAULT_ALIGNMENT, MAGIC};

struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    offset: u64,
    size: u64,
}

/// Collects metadata and tensor shapes, then streams the file: header first, tensor data after, so a
/// multi-gigabyte model never has to be held in memory.
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<PendingTensor>,
    alignment: u64,
    data_len: u64,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        GgufWriter {
            metadata: Vec::new(),
            tensors: Vec::new(),
            alignment: DEFAULT_ALIGNMENT,
            data_len: 0,
        }
    }

    pub fn set(&mut self, key: &str, value: Value) {
        if key == "general.alignment" {
            if let Some(a) = value.as_u64() {
                self.alignment = a;
            }
        }
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some(kv) => kv.1 = value,
            None => self.metadata.push((key.to_string(), value)),
        }
    }

    /// Declare a tensor; its bytes are written later, in declaration order, by `write_data`.
    pub fn add_tensor(&mut self, name: &str, dims: &[u64], ty: GgmlType) -> io::Result<()> {
        let size = tensor_size(dims, ty).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("tensor {name}: shape {dims:?} is not whole {} blocks", ty.name()),
            )
        })?;
        let offset = self.data_len;
        self.data_len = align_up(offset + size, self.alignment).expect("tensor data size overflows u64");
        self.tensors.push(PendingTensor {
            name: name.to_string(),
            dims: dims.to_vec(),
            ty,
            offset,
            size,
        });
        Ok(())
    }

    /// Size of each declared tensor's data, in declaration order.
    pub fn tensor_sizes(&self) -> impl Iterator<Item = (&str, u64)> {
        self.tensors.iter().map(|t| (t.name.as_str(), t.size))
    }

    /// Write the header (magic through the padding before the data section).
    pub fn write_header(&self, w: &mut impl Write) -> io::Result<()> {
        let mut b = Vec::new();
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        b.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            b.extend_from_slice(&encode_str(k));
            b.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
            b.extend_from_slice(&encode_value(v));
        }
        for t in &self.tensors {
            b.extend_from_slice(&encode_str(&t.name));
            b.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                b.extend_from_slice(&d.to_le_bytes());
            }
            b.extend_from_slice(&t.ty.id().to_le_bytes());
            b.extend_from_slice(&t.offset.to_le_bytes());
        }
        let len = b.len() as u64;
        b.resize(
            align_up(len, self.alignment).expect("header size overflows") as usize,
            0,
        );
        w.write_all(&b)
    }

    /// Write one tensor's data (in declaration order), followed by its alignment padding.
    pub fn write_tensor_data(&self, index: usize, data: &[u8], w: &mut impl Write) -> io::Result<()> {
        let t = &self.tensors[index];
        if data.len() as u64 != t.size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("tensor {}: got {} bytes, expected {}", t.name, data.len(), t.size),
            ));
        }
        w.write_all(data)?;
        let end = t.offset + t.size;
        let pad = align_up(end, self.alignment).expect("checked in add_tensor") - end;
        w.write_all(&vec![0u8; pad as usize])
    }

    /// Convenience for small files: header and every tensor's data at once.
    pub fn write_all(&self, data: &[&[u8]], w: &mut impl Write) -> io::Result<()> {
        self.write_header(w)?;
        for (i, d) in data.iter().enumerate() {
            self.write_tensor_data(i, d, w)?;
        }
        Ok(())
    }
}

fn encode_str(s: &str) -> Vec<u8> {
    let mut b = (s.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(s.as_bytes());
    b
}

fn encode_value(v: &Value) -> Vec<u8> {
    match v {
        Value::U8(x) => vec![*x],
        Value::I8(x) => vec![*x as u8],
        Value::U16(x) => x.to_le_bytes().to_vec(),
        Value::I16(x) => x.to_le_bytes().to_vec(),
        Value::U32(x) => x.to_le_bytes().to_vec(),
        Value::I32(x) => x.to_le_bytes().to_vec(),
        Value::F32(x) => x.to_le_bytes().to_vec(),
        Value::Bool(x) => vec![*x as u8],
        Value::String(s) => encode_str(s),
        Value::Array(t, items) => {
            let mut b = (*t as u32).to_le_bytes().to_vec();
            b.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for it in items {
                b.extend_from_slice(&encode_value(it));
            }
            b
        }
        Value::U64(x) => x.to_le_bytes().to_vec(),
        Value::I64(x) => x.to_le_bytes().to_vec(),
        Value::F64(x) => x.to_le_bytes().to_vec(),
    }
}
