//! The cluster's data plane on the wire, and nothing else: [`frame`] reads and writes length-delimited
//! binary frames with a magic, a version, a request id and a size limit; [`payload`] reads a frame's
//! body with every length checked. Written by hand rather than with a codec crate because decoding
//! untrusted input is the point: a frame's declared size is checked against the limit before anything
//! is allocated, and no input can make the decoder panic.

pub mod frame;
pub mod payload;
pub mod session;

pub use frame::{
    read_frame, read_frame_by, write_frame, Deadline, FrameError, FrameHeader, Kind, Timed, DEFAULT_MAX_FRAME,
    HEADER_LEN, TAG_LEN, VERSION,
};
pub use payload::{PayloadError, PayloadReader, PayloadWriter};
pub use session::{Session, Side};

/// Whether two secrets are equal, in time that depends on their lengths only (not on where they first
/// differ), so a peer cannot find a node token byte by byte by timing refusals.
pub fn secrets_equal(a: &[u8], b: &[u8]) -> bool {
    // `subtle` answers unequal lengths at once and compares equal lengths in constant time.
    subtle::ConstantTimeEq::ct_eq(a, b).into()
}

#[cfg(test)]
mod tests {
    #[test]
    fn secrets_compare_whole() {
        assert!(super::secrets_equal(b"abc", b"abc"));
        assert!(!super::secrets_equal(b"abc", b"abd"));
        assert!(!super::secrets_equal(b"abc", b"ab"));
        assert!(!super::secrets_equal(b"", b"a"));
    }
}
