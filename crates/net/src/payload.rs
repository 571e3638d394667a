//! A frame body read field by field, every length checked against what is left, and written the same
//! way. Integers are little-endian.

#[derive(Debug, thiserror::Error)]
#[error("malformed {what}: {why}")]
pub struct PayloadError {
    pub what: &'static str,
    pub why: String,
}

pub struct PayloadReader<'a> {
    what: &'static str,
    rest: &'a [u8],
}

impl<'a> PayloadReader<'a> {
    /// `what` names the message in errors ("compute request").
    pub fn new(what: &'static str, body: &'a [u8]) -> Self {
        PayloadReader { what, rest: body }
    }

    pub fn error(&self, why: impl Into<String>) -> PayloadError {
        PayloadError {
            what: self.what,
            why: why.into(),
        }
    }

    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], PayloadError> {
        if n > self.rest.len() {
            return Err(self.error(format!("needs {n} more bytes, {} left", self.rest.len())));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    pub fn u32(&mut self) -> Result<u32, PayloadError> {
        Ok(u32::from_le_bytes(self.bytes(4)?.try_into().expect("4 bytes")))
    }

    pub fn u64(&mut self) -> Result<u64, PayloadError> {
        Ok(u64::from_le_bytes(self.bytes(8)?.try_into().expect("8 bytes")))
    }

    /// A count of items of `item_bytes` each that must fit in what is left (so a count can never make
    /// the reader allocate for items that are not there).
    pub fn count(&mut self, item_bytes: usize) -> Result<usize, PayloadError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(item_bytes.max(1)) > self.rest.len() {
            return Err(self.error(format!(
                "declares {n} items of {item_bytes} bytes, {} bytes left",
                self.rest.len()
            )));
        }
        Ok(n)
    }

    /// Everything must have been read.
    pub fn finish(self) -> Result<(), PayloadError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(self.error(format!("{} bytes left over", self.rest.len())))
        }
    }
}

/// Appends fields to a body (reused between frames).
pub struct PayloadWriter<'a>(pub &'a mut Vec<u8>);

impl PayloadWriter<'_> {
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_are_checked() {
        let mut body = Vec::new();
        PayloadWriter(&mut body).u32(3).bytes(b"abc").u32(1_000_000);
        let mut r = PayloadReader::new("test", &body);
        let n = r.count(1).unwrap();
        assert_eq!(r.bytes(n).unwrap(), b"abc");
        // A count of a million 4-byte items with 0 bytes left is refused, not allocated.
        let e = PayloadReader::new("test", &body[7..]).count(4).unwrap_err();
        assert!(e.to_string().contains("declares 1000000 items"), "{e}");
        let mut r = PayloadReader::new("test", &body);
        r.u32().unwrap();
        assert!(r.finish().unwrap_err().to_string().contains("left over"));
    }
}
