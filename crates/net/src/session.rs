//! An authenticated connection: once the handshake has proven that both ends know the node token, every
//! frame carries a 16-byte tag under the session's key over its direction, its sequence number, its
//! header and its body. A peer without the token can neither inject a frame, nor alter one, nor replay or
//! reorder them: the receiver expects the next sequence number and checks the tag in constant time.
//!
//! Two kinds of session, chosen at the handshake:
//! - authenticated: the tag is BLAKE3 in keyed mode (a PRF, so a MAC), truncated to 128 bits; bodies
//!   travel in the clear;
//! - encrypted: ChaCha20-Poly1305 under a key derived from the session key, the nonce the direction and the
//!   sequence number (never the same twice under one key), the header as associated data; the tag is the
//!   AEAD's, and nobody on the path sees activations.
//!
//! The session key is derived from the token and both ends' fresh nonces, so no two connections share one.

use std::io::{self, Write};

use chacha20poly1305::aead::AeadInPlace;
use chacha20poly1305::{ChaCha20Poly1305, KeyInit};

use crate::frame::{read_frame_by, write_frame_tagged, Deadline, FrameError, FrameHeader, Kind, Timed, TAG_LEN};

/// Which end of a connection a session is: the two directions' tags differ, so a frame cannot be
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
    /// The cipher of an encrypted session.
    cipher: Option<ChaCha20Poly1305>,
    side: Side,
    /// Sequence numbers of the next frame written and read.
    sent: u64,
    received: u64,
}

impl Session {
    /// An authenticated session: bodies in the clear, each frame MACed.
    pub fn new(key: [u8; 32], side: Side) -> Session {
        Session {
            key,
            cipher: None,
            side,
            sent: 0,
            received: 0,
        }
    }

    /// An encrypted session: bodies encrypted and authenticated.
    pub fn encrypted(key: [u8; 32], side: Side) -> Session {
        let aead_key = blake3::derive_key("titan 2026-12 cluster frame encryption", &key);
        Session {
            cipher: Some(ChaCha20Poly1305::new(&aead_key.into())),
            ..Session::new(key, side)
        }
    }

    pub fn is_encrypted(&self) -> bool {
        self.cipher.is_some()
    }

    fn mac(&self, from: Side, seq: u64, header: &[u8], body: &[u8]) -> [u8; TAG_LEN] {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(&[from.byte()])
            .update(&seq.to_le_bytes())
            .update(header)
            .update(body);
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&h.finalize().as_bytes()[..TAG_LEN]);
        tag
    }

    /// The AEAD nonce of frame `seq` from `from`: unique per direction and frame, as the key is per session.
    fn nonce(from: Side, seq: u64) -> chacha20poly1305::Nonce {
        let mut n = [0u8; 12];
        n[0] = from.byte();
        n[4..].copy_from_slice(&seq.to_le_bytes());
        n.into()
    }

    /// Writes one frame with the next sequence number's tag (its body encrypted in an encrypted session).
    pub fn write(
        &mut self,
        w: &mut impl Write,
        kind: Kind,
        id: u64,
        body: &[u8],
        scratch: &mut Vec<u8>,
    ) -> io::Result<()> {
        let (side, seq) = (self.side, self.sent);
        let mut failed = false;
        write_frame_tagged(w, kind, id, body, scratch, |header, body| match &self.cipher {
            None => self.mac(side, seq, header, body),
            Some(c) => match c.encrypt_in_place_detached(&Self::nonce(side, seq), header, body) {
                Ok(tag) => tag.into(),
                Err(_) => {
                    failed = true;
                    [0; TAG_LEN]
                }
            },
        })?;
        if failed {
            // Only a body past the cipher's 256 GiB limit fails, and frames are far below it.
            return Err(io::Error::other("encrypting a frame failed"));
        }
        self.sent += 1;
        Ok(())
    }

    /// Reads one frame, whole by `deadline`, and checks its tag against the next sequence number from the
    /// other end (decrypting its body in an encrypted session): a frame altered, injected, replayed or out
    /// of order is [`FrameError::BadMac`].
    pub fn read(
        &mut self,
        r: &mut (impl Timed + ?Sized),
        limit: usize,
        body: &mut Vec<u8>,
        deadline: Deadline,
    ) -> Result<FrameHeader, FrameError> {
        let (h, header, tag) = read_frame_by(r, limit, body, deadline)?;
        let from = self.side.other();
        let good = match &self.cipher {
            None => {
                let want = self.mac(from, self.received, &header, body);
                bool::from(subtle::ConstantTimeEq::ct_eq(&want[..], &tag[..]))
            }
            Some(c) => c
                .decrypt_in_place_detached(&Self::nonce(from, self.received), &header, body, &tag.into())
                .is_ok(),
        };
        if !good {
            return Err(FrameError::BadMac);
        }
        self.received += 1;
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::HEADER_LEN;

    /// Both kinds of session: a frame goes through once; altered, replayed or reflected it fails; an
    /// encrypted body does not show on the wire.
    #[test]
    fn frames_go_through_once_and_unaltered() {
        for encrypted in [false, true] {
            let make = |side| {
                if encrypted {
                    Session::encrypted([7; 32], side)
                } else {
                    Session::new([7; 32], side)
                }
            };
            let (mut b, mut n) = (make(Side::Backbone), make(Side::Node));
            let body = b"activations activations activations".to_vec();
            let mut wire = Vec::new();
            b.write(&mut wire, Kind::Compute, 1, &body, &mut Vec::new()).unwrap();
            let first = wire.clone();
            b.write(&mut wire, Kind::Compute, 2, &body, &mut Vec::new()).unwrap();
            let shown = wire.windows(body.len()).any(|w| w == &body[..]);
            assert_eq!(shown, !encrypted, "encrypted {encrypted}");
            let mut got = Vec::new();
            let mut r = &wire[..];
            assert_eq!(n.read(&mut r, 1 << 10, &mut got, Deadline::None).unwrap().id, 1);
            assert_eq!(got, body);
            assert_eq!(n.read(&mut r, 1 << 10, &mut got, Deadline::None).unwrap().id, 2);
            assert_eq!(got, body);
            // The first frame again (a replay), or altered, or sent back to its sender: refused.
            let mut r = &first[..];
            assert!(matches!(
                n.read(&mut r, 1 << 10, &mut got, Deadline::None),
                Err(FrameError::BadMac)
            ));
            let mut altered = first.clone();
            altered[HEADER_LEN + 3] ^= 1;
            let mut fresh = make(Side::Node);
            let mut r = &altered[..];
            assert!(matches!(
                fresh.read(&mut r, 1 << 10, &mut got, Deadline::None),
                Err(FrameError::BadMac)
            ));
            let mut own = make(Side::Backbone);
            let mut r = &first[..];
            assert!(matches!(
                own.read(&mut r, 1 << 10, &mut got, Deadline::None),
                Err(FrameError::BadMac)
            ));
        }
    }
}
