//! NumPy `.npy` (format 1.0) for float32 matrices, so anyone can load TITAN's logits with `np.load`.

use std::io::{self, Write};

pub fn write_f32(w: &mut impl Write, shape: &[usize], data: &[f32]) -> io::Result<()> {
    assert_eq!(shape.iter().product::<usize>(), data.len(), "shape does not match data");
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape = if dims.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
    // magic (6) + version (2) + length (2) + header + '\n' is padded to a multiple of 64 bytes.
    let total = 10 + header.len() + 1;
    header.push_str(&" ".repeat((64 - total % 64) % 64));
    header.push('\n');
    w.write_all(b"\x93NUMPY\x01\x00")?;
    w.write_all(&(header.len() as u16).to_le_bytes())?;
    w.write_all(header.as_bytes())?;
    let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    w.write_all(&bytes)
}

#[cfg(test)]
mod tests {
    #[test]
    fn header_is_aligned_and_data_follows() {
        let mut out = Vec::new();
        super::write_f32(&mut out, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        let hlen = u16::from_le_bytes([out[8], out[9]]) as usize;
        assert_eq!((10 + hlen) % 64, 0);
        let header = std::str::from_utf8(&out[10..10 + hlen]).unwrap();
        assert!(header.contains("'shape': (2, 3)") && header.ends_with('\n'));
        assert_eq!(out.len(), 10 + hlen + 24);
        assert_eq!(f32::from_le_bytes(out[10 + hlen + 20..].try_into().unwrap()), 6.0);
    }
}
