//! An authenticated connection: once the handshake has proven that both ends know the node token, every
//! frame carries a 16-byte MAC under the session's key over its direction, its sequence number, its
//! header and its body. A peer without the token can neither inject a frame, nor alter one, nor replay or
//! reorder them: the receiver expects the next sequence number and checks the MAC in constant time.
//!
//! The MAC is BLAKE3 in keyed mode (a PRF, so a MAC), truncated to 128 bits; the session key is derived
//! from the token and both ends' fresh nonces, so no two connections share one.

use std::io::{self, Write};

use crate::frame::{read_frame_by, write_frame_tagged, Deadline, FrameError, FrameHeader, Kind, Timed, TAG_LEN};

/// Which end of a connection a session is: the two directions' MACs differ, so a frame cannot be
/// reflected back to its sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Backbone,
    Node,
}

impl Side {
    fn byte(self) -> u8 {
        match self {
            Side::Backbone => b'B',
            Side::Node => b'N',
        }
    }

    fn other(self) -> Side {
        match self {
            Side::Backbone => Side::Node,
            Side::Node => Side::Backbone,
        }
    }
}

pub struct Session {
    key: [u8; 32],
    side: Side,
    /// Sequence numbers of the next frame written and read.
    sent: u64,
    received: u64,
}

impl Session {
    pub fn new(key: [u8; 32], side: Side) -> Session {
        Session {
            key,
            side,
            sent: 0,
            received: 0,
        }
    }

    fn tag(&self, from: Side, seq: u64, header: &[u8], body: &[u8]) -> [u8; TAG_LEN] {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(&[from.byte()])
            .update(&seq.to_le_bytes())
            .update(header)
            .update(body);
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&h.finalize().as_bytes()[..TAG_LEN]);
        tag
    }

    /// Writes one frame with the next sequence number's MAC.
    pub fn write(
        &mut self,
        w: &mut impl Write,
        kind: Kind,
        id: u64,
        body: &[u8],
        scratch: &mut Vec<u8>,
    ) -> io::Result<()> {
        let (side, seq) = (self.side, self.sent);
        write_frame_tagged(w, kind, id, body, scratch, |header, body| {
            self.tag(side, seq, header, body)
        })?;
        self.sent += 1;
        Ok(())
    }

    /// Reads one frame, whole by `deadline`, and checks its MAC against the next sequence number from the
    /// other end: a frame altered, injected, replayed or out of order is [`FrameError::BadMac`].
    pub fn read(
        &mut self,
        r: &mut (impl Timed + ?Sized),
        limit: usize,
        body: &mut Vec<u8>,
        deadline: Deadline,
    ) -> Result<FrameHeader, FrameError> {
        let (h, header, tag) = read_frame_by(r, limit, body, deadline)?;
        let want = self.tag(self.side.other(), self.received, &header, body);
        if !bool::from(subtle::ConstantTimeEq::ct_eq(&want[..], &tag[..])) {
            return Err(FrameError::BadMac);
        }
        self.received += 1;
        Ok(h)
    }
}
