//! The zero-copy reader: parse the header once, then hand out tensor data as slices of the mapping.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use titan_kernels::GgmlType;

use crate::value::{Value, ValueType};
use crate::{GgufError, DEFAULT_ALIGNMENT, MAGIC};

/// GGML's limit on tensor rank.
const MAX_DIMS: u32 = 4;

#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions in GGML order: `dims[0]` is the innermost (contiguous) one, the row length.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset from the start of the data section.
    pub offset: u64,
    /// Size of the encoded data in bytes.
    pub size: u64,
}

impl TensorInfo {
    /// Number of rows when viewed as a matrix of `dims[0]`-long rows.
    pub fn n_rows(&self) -> u64 {
        self.dims[1..].iter().product()
    }
}

pub struct GgufFile {
    path: PathBuf,
    map: Mmap,
    pub version: u32,
    pub alignment: u64,
    /// Metadata in file order.
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorInfo>,
    /// Absolute file offset of the tensor data section.
    pub data_offset: u64,
    meta_index: HashMap<String, usize>,
    tensor_index: HashMap<String, usize>,
}

impl GgufFile {
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref().to_path_buf();
        let display = path.display().to_string();
        let io = |error| GgufError::Io {
            path: display.clone(),
            error,
        };
        let file = File::open(&path).map_err(io)?;
        if file.metadata().map_err(io)?.is_dir() {
            return Err(GgufError::Directory { path: display });
        }
        // SAFETY: the mapping is read-only; a concurrent writer to the model file is outside our contract,
        // as it is for every mmap-based loader (llama.cpp included).
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::parse(path, map)
    }

    fn parse(path: PathBuf, map: Mmap) -> Result<GgufFile, GgufError> {
        let display = path.display().to_string();
        let mut c = Cursor {
            buf: &map[..],
            pos: 0,
            path: &display,
        };
        let magic = c.bytes(4, "magic")?;
        if magic != MAGIC {
            return Err(GgufError::BadMagic {
                path: display.clone(),
                found: String::from_utf8_lossy(magic).into_owned(),
            });
        }
        let version = c.u32("version")?;
        if version != 2 && version != 3 {
            return Err(GgufError::BadVersion {
                path: display.clone(),
                version,
            });
        }
        let n_tensors = c.u64("tensor count")?;
        let n_kv = c.u64("metadata count")?;
        // Each key/value takes at least 8 (key length) + 4 (type) + 1 bytes, each tensor info at least 8 + 4 + 4 + 8:
        // a count that cannot fit in the file is rejected before anything is allocated for it.
        c.check_count(n_kv, 13, "metadata count")?;
        c.check_count(n_tensors, 24, "tensor count")?;

        let mut metadata = Vec::with_capacity(n_kv as usize);
        let mut meta_index = HashMap::with_capacity(n_kv as usize);
        for _ in 0..n_kv {
            let key = c.string("metadata key")?;
            let ty = c.value_type(&key)?;
            let value = c.value(ty, &key, 0)?;
            if meta_index.insert(key.clone(), metadata.len()).is_some() {
                return Err(c.invalid(format!("duplicate metadata key {key:?}")));
            }
            metadata.push((key, value));
        }

        let alignment = match meta_index.get("general.alignment").map(|&i| &metadata[i].1) {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() => a,
                _ => return Err(c.invalid(format!("general.alignment {v} is not a power of two"))),
            },
        };

        let mut infos = Vec::with_capacity(n_tensors as usize);
        for _ in 0..n_tensors {
            let name = c.string("tensor name")?;
            let n_dims = c.u32("tensor rank")?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(c.invalid(format!("tensor {name:?} has rank {n_dims} (must be 1..={MAX_DIMS})")));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(c.u64("tensor dimension")?);
            }
            let type_id = c.u32("tensor type")?;
            let offset = c.u64("tensor offset")?;
            let ty = GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnsupportedType {
                path: display.clone(),
                name: name.clone(),
                type_id,
            })?;
            infos.push((name, dims, ty, offset));
        }
        let data_offset =
            align_up(c.pos as u64, alignment).ok_or_else(|| c.invalid("data section offset overflows".into()))?;
        let len = map.len() as u64;

        let mut tensors = Vec::with_capacity(infos.len());
        let mut tensor_index = HashMap::with_capacity(infos.len());
        for (name, dims, ty, offset) in infos {
            let size = tensor_size(&dims, ty).ok_or_else(|| {
                c.invalid(format!(
                    "tensor {name:?} has shape {dims:?} which is not a whole number of {} blocks or overflows",
                    ty.name()
                ))
            })?;
            if offset % alignment != 0 {
                return Err(c.invalid(format!("tensor {name:?} offset {offset} is not aligned to {alignment}")));
            }
            let end = data_offset.checked_add(offset).and_then(|s| s.checked_add(size));
            if end.is_none_or(|e| e > len) {
                return Err(GgufError::TensorOutOfBounds {
                    path: display.clone(),
                    name,
                    offset: data_offset.saturating_add(offset),
                    size,
                    len,
                });
            }
            if tensor_index.insert(name.clone(), tensors.len()).is_some() {
                return Err(c.invalid(format!("duplicate tensor name {name:?}")));
            }
            tensors.push(TensorInfo {
                name,
                dims,
                ty,
                offset,
                size,
            });
        }
        check_disjoint(&tensors).map_err(|what| c.invalid(what))?;

        Ok(GgufFile {
            path,
            map,
            version,
            alignment,
            metadata,
            tensors,
            data_offset,
            meta_index,
            tensor_index,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Total size of the file in bytes.
    pub fn file_len(&self) -> u64 {
        self.map.len() as u64
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The encoded bytes of a tensor: a view into the mapping (bounds were checked at open).
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        let start = (self.data_offset + info.offset) as usize;
        &self.map[start..start + info.size as usize]
    }

    /// Any byte range of the file (e.g. one expert of a stacked tensor); `None` if it is out of bounds.
    pub fn bytes(&self, start: usize, len: usize) -> Option<&[u8]> {
        self.map.get(start..start.checked_add(len)?)
    }

    /// Tells the kernel this process will not read `[start, start + len)` again (its contents were
    /// copied elsewhere), so those pages leave the process's resident set; they stay in the page cache,
    /// and a later read still works (the pages fault back in). Pages the range only partly covers are
    /// included, which costs a neighbour at most a refault.
    pub fn release(&self, start: usize, len: usize) {
        // SAFETY: MADV_DONTNEED on a read-only shared file mapping only drops this process's page
        // table entries; the file's data is untouched and is read back on the next access.
        let _ = unsafe {
            self.map
                .unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, len)
        };
    }

    /// Bring bytes `start..start + len` of the mapping into memory now, as llama.cpp's loader does with
    /// its whole mapping (MAP_POPULATE): returns once every page is in (MADV_POPULATE_READ), or, on a kernel
    /// without that advice (before Linux 5.14) or another system, asks for them to be read ahead.
    pub fn populate(&self, start: usize, len: usize) {
        #[cfg(target_os = "linux")]
        if self.map.advise_range(memmap2::Advice::PopulateRead, start, len).is_ok() {
            return;
        }
        let _ = self.map.advise_range(memmap2::Advice::WillNeed, start, len);
    }

    fn err(&self, key: &str, what: impl Into<String>) -> GgufError {
        GgufError::Metadata {
            path: self.path.display().to_string(),
            key: key.to_string(),
            what: what.into(),
        }
    }

    pub fn require(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key).ok_or_else(|| self.err(key, "missing"))
    }

    pub fn get_u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        self.get(key)
            .map(|v| {
                v.as_u64()
                    .ok_or_else(|| self.err(key, format!("expected an unsigned integer, found {v}")))
            })
            .transpose()
    }

    pub fn get_f64(&self, key: &str) -> Result<Option<f64>, GgufError> {
        self.get(key)
            .map(|v| {
                v.as_f64()
                    .ok_or_else(|| self.err(key, format!("expected a number, found {v}")))
            })
            .transpose()
    }

    pub fn get_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        self.get(key)
            .map(|v| {
                v.as_bool()
                    .ok_or_else(|| self.err(key, format!("expected a bool, found {v}")))
            })
            .transpose()
    }

    pub fn get_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        self.get(key)
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| self.err(key, format!("expected a string, found {v}")))
            })
            .transpose()
    }

    pub fn get_array(&self, key: &str) -> Result<Option<&[Value]>, GgufError> {
        self.get(key)
            .map(|v| {
                v.as_array()
                    .ok_or_else(|| self.err(key, format!("expected an array, found {v}")))
            })
            .transpose()
    }

    /// A required unsigned integer.
    pub fn u64_of(&self, key: &str) -> Result<u64, GgufError> {
        self.get_u64(key)?.ok_or_else(|| self.err(key, "missing"))
    }

    /// An array of strings (e.g. the vocabulary).
    pub fn strings(&self, key: &str) -> Result<Option<Vec<String>>, GgufError> {
        let Some(a) = self.get_array(key)? else { return Ok(None) };
        a.iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| self.err(key, "expected an array of strings"))
            })
            .collect::<Result<_, _>>()
            .map(Some)
    }

    /// An array of numbers as f32 (e.g. token scores).
    pub fn f32s(&self, key: &str) -> Result<Option<Vec<f32>>, GgufError> {
        let Some(a) = self.get_array(key)? else { return Ok(None) };
        a.iter()
            .map(|v| {
                v.as_f64()
                    .map(|x| x as f32)
                    .ok_or_else(|| self.err(key, "expected an array of numbers"))
            })
            .collect::<Result<_, _>>()
            .map(Some)
    }

    /// An array of integers as i64 (e.g. token types).
    pub fn i64s(&self, key: &str) -> Result<Option<Vec<i64>>, GgufError> {
        let Some(a) = self.get_array(key)? else { return Ok(None) };
        a.iter()
            .map(|v| v.as_i64().ok_or_else(|| self.err(key, "expected an array of integers")))
            .collect::<Result<_, _>>()
            .map(Some)
    }
}

/// Bytes of a tensor of this shape and type, or `None` if the row is not whole blocks or the size overflows.
pub(crate) fn tensor_size(dims: &[u64], ty: GgmlType) -> Option<u64> {
    let row = ty.row_bytes(usize::try_from(*dims.first()?).ok()?)? as u64;
    dims[1..].iter().try_fold(row, |acc, &d| acc.checked_mul(d))
}

/// No two tensors may share bytes: a tensor whose range overlaps another's (an expert tensor pointing at
/// the LM head, say) would load and silently compute with the wrong weights.
fn check_disjoint(tensors: &[TensorInfo]) -> Result<(), String> {
    let mut ranges: Vec<(u64, u64, &str)> = tensors
        .iter()
        .filter(|t| t.size > 0)
        .map(|t| (t.offset, t.offset + t.size, t.name.as_str()))
        .collect();
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        let ((a0, a1, a), (b0, b1, b)) = (w[0], w[1]);
        if b0 < a1 {
            return Err(format!(
                "tensors {a:?} (data bytes {a0}..{a1}) and {b:?} (data bytes {b0}..{b1}) overlap"
            ));
        }
    }
    Ok(())
}

pub(crate) fn align_up(x: u64, a: u64) -> Option<u64> {
    Some(x.checked_add(a - 1)? / a * a)
}

/// Bounds-checked little-endian reads over the header.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a str,
}

impl<'a> Cursor<'a> {
    fn invalid(&self, what: String) -> GgufError {
        GgufError::Invalid {
            path: self.path.to_string(),
            what,
        }
    }

    fn bytes(&mut self, n: u64, what: &str) -> Result<&'a [u8], GgufError> {
        let remaining = (self.buf.len() - self.pos) as u64;
        if n > remaining {
            return Err(GgufError::Truncated {
                path: self.path.to_string(),
                what: what.to_string(),
                offset: self.pos as u64,
                need: n,
                len: self.buf.len() as u64,
            });
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        Ok(self.bytes(N as u64, what)?.try_into().expect("length checked"))
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Reject a count whose minimal encoding would not fit in the rest of the file.
    fn check_count(&self, count: u64, min_each: u64, what: &str) -> Result<(), GgufError> {
        let remaining = (self.buf.len() - self.pos) as u64;
        match count.checked_mul(min_each) {
            Some(n) if n <= remaining => Ok(()),
            _ => Err(self.invalid(format!(
                "{what} {count} cannot fit in the file ({remaining} bytes left at offset {})",
                self.pos
            ))),
        }
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let n = self.u64(what)?;
        let start = self.pos;
        let b = self.bytes(n, what)?;
        String::from_utf8(b.to_vec()).map_err(|_| self.invalid(format!("{what} at offset {start} is not valid UTF-8")))
    }

    fn value_type(&mut self, key: &str) -> Result<ValueType, GgufError> {
        let id = self.u32("value type")?;
        ValueType::from_id(id).ok_or_else(|| self.invalid(format!("metadata key {key:?} has unknown value type {id}")))
    }

    fn value(&mut self, ty: ValueType, key: &str, depth: u32) -> Result<Value, GgufError> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(key)?[0]),
            ValueType::I8 => Value::I8(self.array::<1>(key)?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(key)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(key)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array(key)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(key)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(key)?)),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array(key)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(key)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(key)?)),
            ValueType::Bool => match self.array::<1>(key)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.invalid(format!("metadata key {key:?} has bool byte {b}"))),
            },
            ValueType::String => Value::String(self.string(key)?),
            ValueType::Array => {
                if depth > 0 {
                    return Err(self.invalid(format!(
                        "metadata key {key:?} nests arrays, which GGUF readers do not support"
                    )));
                }
                let elem = self.value_type(key)?;
                let n = self.u64(key)?;
                // A string element takes at least its 8-byte length; a nested array is rejected above.
                self.check_count(n, elem.scalar_size().unwrap_or(8), &format!("array length of {key:?}"))?;
                let mut v = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    v.push(self.value(elem, key, depth + 1)?);
                }
                Value::Array(elem, v)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GgufWriter;
    use std::io::Write;

    fn sample() -> Vec<u8> {
        let mut w = GgufWriter::new();
        w.set("general.architecture", Value::String("qwen3moe".into()));
        w.set("qwen3moe.block_count", Value::U32(2));
        w.set("test.f64", Value::F64(0.5));
        w.set("test.bool", Value::Bool(true));
        w.set("test.i8", Value::I8(-3));
        w.set(
            "tokenizer.ggml.tokens",
            Value::Array(
                ValueType::String,
                vec![Value::String("a".into()), Value::String("é".into())],
            ),
        );
        w.set(
            "test.scores",
            Value::Array(ValueType::F32, vec![Value::F32(1.5), Value::F32(-2.0)]),
        );
        w.add_tensor("a", &[4, 2], GgmlType::F32).unwrap();
        w.add_tensor("b", &[32], GgmlType::Q8_0).unwrap();
        let a: Vec<u8> = (0..8).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let b = vec![7u8; 34];
        let mut out = Vec::new();
        w.write_all(&[&a, &b], &mut out).unwrap();
        out
    }

    fn write(bytes: &[u8]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.gguf");
        std::fs::File::create(&p).unwrap().write_all(bytes).unwrap();
        (dir, p)
    }

    fn open_err(bytes: &[u8]) -> String {
        let (_d, p) = write(bytes);
        match GgufFile::open(&p) {
            Ok(_) => panic!("expected an error"),
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.contains("m.gguf"), "error does not name the file: {msg}");
                assert!(!msg.contains('\n'), "error is not one line: {msg}");
                msg
            }
        }
    }

    #[test]
    fn round_trip() {
        let (_d, p) = write(&sample());
        let f = GgufFile::open(&p).unwrap();
        assert_eq!(f.version, 3);
        assert_eq!(f.get_str("general.architecture").unwrap(), Some("qwen3moe"));
        assert_eq!(f.u64_of("qwen3moe.block_count").unwrap(), 2);
        assert_eq!(f.get_f64("test.f64").unwrap(), Some(0.5));
        assert_eq!(f.get_bool("test.bool").unwrap(), Some(true));
        assert_eq!(f.get("test.i8"), Some(&Value::I8(-3)));
        assert_eq!(f.strings("tokenizer.ggml.tokens").unwrap().unwrap(), vec!["a", "é"]);
        assert_eq!(f.f32s("test.scores").unwrap().unwrap(), vec![1.5, -2.0]);
        let a = f.tensor("a").unwrap();
        assert_eq!(
            (a.dims.clone(), a.ty, a.size, a.n_rows()),
            (vec![4, 2], GgmlType::F32, 32, 2)
        );
        let data = f.tensor_data(a);
        assert_eq!(f32::from_le_bytes(data[28..32].try_into().unwrap()), 7.0);
        let b = f.tensor("b").unwrap();
        assert_eq!(b.offset % f.alignment, 0);
        assert_eq!(f.tensor_data(b), &[7u8; 34][..]);
        // tensor data is a view into the mapping, not a copy
        let base = f.map.as_ptr() as usize;
        assert_eq!(data.as_ptr() as usize, base + (f.data_offset + a.offset) as usize);
    }

    #[test]
    fn overlapping_tensors_are_refused() {
        let mut bytes = sample();
        // Tensor "b"'s info: name length 1, "b", rank 1, dim 32, type Q8_0 (8), then its offset (32): point it
        // at "a"'s bytes.
        let info: Vec<u8> = [
            &1u64.to_le_bytes()[..],
            b"b",
            &1u32.to_le_bytes(),
            &32u64.to_le_bytes(),
            &8u32.to_le_bytes(),
        ]
        .concat();
        let at = bytes.windows(info.len()).position(|w| w == info).unwrap() + info.len();
        assert_eq!(bytes[at..at + 8], 32u64.to_le_bytes());
        bytes[at..at + 8].copy_from_slice(&0u64.to_le_bytes());
        let msg = open_err(&bytes);
        assert!(
            msg.contains("tensors \"a\" (data bytes 0..32) and \"b\" (data bytes 0..34) overlap"),
            "{msg}"
        );
    }

    #[test]
    fn version_2_is_read() {
        let mut bytes = sample();
        bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
        let (_d, p) = write(&bytes);
        assert_eq!(GgufFile::open(&p).unwrap().version, 2);
    }

    #[test]
    fn wrong_magic() {
        let mut bytes = sample();
        bytes[..4].copy_from_slice(b"GGML");
        assert!(open_err(&bytes).contains("not a GGUF file"));
    }

    #[test]
    fn wrong_version() {
        let mut bytes = sample();
        bytes[4..8].copy_from_slice(&7u32.to_le_bytes());
        assert!(open_err(&bytes).contains("unsupported GGUF version 7"));
    }

    #[test]
    fn truncated_anywhere_is_an_error() {
        let bytes = sample();
        let (_d, p) = write(&bytes);
        let f = GgufFile::open(&p).unwrap();
        let b = f.tensor("b").unwrap();
        let end_of_data = (f.data_offset + b.offset + b.size) as usize;
        for cut in [0, 3, 10, 30, 100, end_of_data - 40, end_of_data - 1] {
            let msg = open_err(&bytes[..cut]);
            assert!(
                msg.contains("truncated") || msg.contains("past the end") || msg.contains("cannot fit"),
                "{cut}: {msg}"
            );
        }
    }

    #[test]
    fn metadata_count_that_would_overflow() {
        let mut bytes = sample();
        bytes[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(open_err(&bytes).contains("metadata count"));
    }

    #[test]
    fn array_length_that_would_overflow() {
        let mut w = GgufWriter::new();
        w.set("x", Value::Array(ValueType::U32, vec![Value::U32(1)]));
        let mut bytes = Vec::new();
        w.write_all(&[], &mut bytes).unwrap();
        // header(24) + key len(8) + "x"(1) + type(4) + elem type(4) = 41: the array count follows
        bytes[41..49].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
        assert!(open_err(&bytes).contains("array length"));
    }

    #[test]
    fn tensor_past_end_of_file() {
        let mut w = GgufWriter::new();
        w.add_tensor("big", &[64, 64], GgmlType::F32).unwrap();
        let mut bytes = Vec::new();
        w.write_header(&mut bytes).unwrap();
        bytes.extend_from_slice(&[0u8; 100]);
        assert!(open_err(&bytes).contains("points past the end"));
    }

    #[test]
    fn unsupported_tensor_type() {
        let mut w = GgufWriter::new();
        w.add_tensor("t", &[32], GgmlType::F32).unwrap();
        let mut bytes = Vec::new();
        w.write_all(&[&[0u8; 128]], &mut bytes).unwrap();
        // the type id sits after: header 24, name (8+1), rank 4, dim 8
        let at = 24 + 9 + 4 + 8;
        bytes[at..at + 4].copy_from_slice(&99u32.to_le_bytes());
        assert!(open_err(&bytes).contains("unsupported type id 99"));
    }

    /// A directory is named as one (mapping it said "No such device"); a missing file's cause is said once,
    /// whether the error is printed alone or with its sources.
    #[test]
    fn a_directory_or_a_missing_file_is_named_once() {
        let dir = tempfile::tempdir().unwrap();
        let msg = GgufFile::open(dir.path()).err().unwrap().to_string();
        assert_eq!(msg, format!("{} is a directory, not a GGUF file", dir.path().display()));
        let e = GgufFile::open(dir.path().join("none.gguf")).err().unwrap();
        assert!(std::error::Error::source(&e).is_none(), "{e}");
        assert_eq!(e.to_string().matches("No such file").count(), 1, "{e}");
    }

    #[test]
    fn misaligned_tensor_offset() {
        let mut w = GgufWriter::new();
        w.add_tensor("t", &[8], GgmlType::F32).unwrap();
        let mut bytes = Vec::new();
        w.write_all(&[&[0u8; 32]], &mut bytes).unwrap();
        let at = 24 + 9 + 4 + 8 + 4;
        bytes[at..at + 8].copy_from_slice(&3u64.to_le_bytes());
        assert!(open_err(&bytes).contains("not aligned"));
    }
}
