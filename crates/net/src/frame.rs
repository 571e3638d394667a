//! A frame: a 20-byte header — magic `TTNF`, version, kind, two reserved zero bytes, a request id and
//! the body's length, all little-endian — then the body, then a 16-byte tag: the MAC of an authenticated
//! session ([`crate::Session`]), zeros in the handshake's frames, which prove themselves.

use std::io::{self, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

pub const MAGIC: [u8; 4] = *b"TTNF";
/// 2: frames carry a tag, connections start with a challenge–response (version 1 sent the token).
pub const VERSION: u8 = 2;
pub const HEADER_LEN: usize = 20;
/// Bytes of a frame's tag, after its body.
pub const TAG_LEN: usize = 16;
/// The largest body accepted unless a peer is configured otherwise: 64 MiB, far above one layer's
/// exchange (a 512-token prompt of a 4096-wide model in Q8_0 is 2.2 MB out, 8 MB back).
pub const DEFAULT_MAX_FRAME: usize = 64 << 20;

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Backbone → node: the model the backbone runs and its nonce (JSON; never the token).
    Hello = 1,
    /// Node → backbone, once both proved they know the token: its model, budget and capabilities (JSON).
    Welcome = 2,
    /// Backbone → node: one layer's rows and the experts to apply to them.
    Compute = 3,
    /// Node → backbone: each expert's output rows.
    Output = 4,
    /// Either way: a refusal or failure, as UTF-8 text; the connection closes after it.
    Error = 5,
    /// Backbone → node: echo the body (round-trip measurement, health).
    Ping = 6,
    Pong = 7,
    /// Backbone → node: the node's counters, answered as JSON in a `Metrics` frame.
    MetricsRequest = 8,
    Metrics = 9,
    /// Backbone → node: dense products split by output rows (the projections, the LM head).
    Rows = 10,
    /// Node → backbone: the products' output rows.
    RowsOutput = 11,
    /// Node → backbone, answering a hello: the node's nonce and its proof that it knows the token.
    Challenge = 12,
    /// Backbone → node: the backbone's proof that it knows the token.
    Proof = 13,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        use Kind::*;
        [
            Hello,
            Welcome,
            Compute,
            Output,
            Error,
            Ping,
            Pong,
            MetricsRequest,
            Metrics,
            Rows,
            RowsOutput,
            Challenge,
            Proof,
        ]
        .into_iter()
        .find(|k| *k as u8 == v)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: Kind,
    pub id: u64,
    pub len: usize,
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The peer closed the connection cleanly between two frames.
    #[error("connection closed")]
    Closed,
    /// The first four bytes are not `TTNF`: the peer does not speak this protocol.
    #[error("not a TITAN frame (magic {0:02x?})")]
    BadMagic([u8; 4]),
    /// The peer speaks another version of the protocol.
    #[error("frame version {0}, this build speaks version {VERSION}")]
    BadVersion(u8),
    /// A kind this build does not know.
    #[error("unknown frame kind {0}")]
    BadKind(u8),
    /// The two reserved header bytes are not zero.
    #[error("reserved header bytes are not zero")]
    BadReserved,
    /// The body declared is larger than the reader accepts (refused before anything is allocated).
    #[error("frame of {len} bytes exceeds the limit of {limit} bytes")]
    TooLarge { len: u64, limit: usize },
    /// The socket failed, timed out, or closed inside a frame; shown as the I/O error itself (no second
    /// copy of it as a source).
    #[error(transparent)]
    Io(#[from] io::Error),
    /// The frame's MAC is not the session's for the next frame: altered, injected, replayed or reordered
    /// on the way, or sent by someone without the token.
    #[error("a frame failed its authentication (altered, replayed or injected on the way)")]
    BadMac,
    /// The whole frame did not arrive by its deadline (however it trickled).
    #[error("the frame did not arrive whole within {0:?}")]
    Late(Duration),
}

impl FrameError {
    /// A read deadline passed (the socket's timeout), as opposed to a broken or refused frame.
    pub fn is_timeout(&self) -> bool {
        matches!(self, FrameError::Io(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut))
    }
}

pub fn encode_header(h: &FrameHeader) -> [u8; HEADER_LEN] {
    let mut b = [0u8; HEADER_LEN];
    b[..4].copy_from_slice(&MAGIC);
    b[4] = VERSION;
    b[5] = h.kind as u8;
    b[8..16].copy_from_slice(&h.id.to_le_bytes());
    b[16..20].copy_from_slice(&(h.len as u32).to_le_bytes());
    b
}

/// Checks a header's fields and its body length against `limit`.
pub fn decode_header(b: &[u8; HEADER_LEN], limit: usize) -> Result<FrameHeader, FrameError> {
    let magic: [u8; 4] = b[..4].try_into().expect("4 bytes");
    if magic != MAGIC {
        return Err(FrameError::BadMagic(magic));
    }
    if b[4] != VERSION {
        return Err(FrameError::BadVersion(b[4]));
    }
    let kind = Kind::from_u8(b[5]).ok_or(FrameError::BadKind(b[5]))?;
    if b[6] != 0 || b[7] != 0 {
        return Err(FrameError::BadReserved);
    }
    let id = u64::from_le_bytes(b[8..16].try_into().expect("8 bytes"));
    let len = u32::from_le_bytes(b[16..20].try_into().expect("4 bytes")) as u64;
    if len > limit as u64 {
        return Err(FrameError::TooLarge { len, limit });
    }
    Ok(FrameHeader {
        kind,
        id,
        len: len as usize,
    })
}

/// A byte source whose reads can be given a time limit: what a deadline on a whole message needs.
pub trait Timed: Read {
    fn set_read_timeout(&mut self, t: Option<Duration>) -> io::Result<()>;
}

impl Timed for BufReader<TcpStream> {
    fn set_read_timeout(&mut self, t: Option<Duration>) -> io::Result<()> {
        self.get_ref().set_read_timeout(t)
    }
}

impl Timed for TcpStream {
    fn set_read_timeout(&mut self, t: Option<Duration>) -> io::Result<()> {
        TcpStream::set_read_timeout(self, t)
    }
}

/// Bytes in memory never wait.
impl Timed for &[u8] {
    fn set_read_timeout(&mut self, _: Option<Duration>) -> io::Result<()> {
        Ok(())
    }
}

/// When a frame must have arrived whole.
#[derive(Clone, Copy, Debug)]
pub enum Deadline {
    /// Whenever: the socket's own timeout, if it has one, applies to each read.
    None,
    /// The whole frame by this instant (a backbone's answer, a connection's first frame).
    By(Instant),
    /// Any wait for the frame to begin (a backbone idles between tokens), then the whole frame within this
    /// long of its first byte.
    Once(Duration),
}

/// Reads one frame into `body` (reused; resized to the body's length only after the header passed its
/// checks, so no more than `limit` bytes are ever allocated), by `deadline`. Returns the header, its bytes
/// (for a MAC) and the tag. A peer that closes cleanly between frames gives [`FrameError::Closed`].
pub fn read_frame_by(
    r: &mut (impl Timed + ?Sized),
    limit: usize,
    body: &mut Vec<u8>,
    deadline: Deadline,
) -> Result<(FrameHeader, [u8; HEADER_LEN], [u8; TAG_LEN]), FrameError> {
    let mut until = match deadline {
        Deadline::By(t) => Some(t),
        Deadline::None | Deadline::Once(_) => None,
    };
    let mut head = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        wait(r, until, deadline)?;
        match r.read(&mut head[got..]) {
            Ok(0) if got == 0 => return Err(FrameError::Closed),
            Ok(0) => {
                return Err(
                    io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed inside a frame header").into(),
                )
            }
            Ok(n) => {
                if got == 0 {
                    if let Deadline::Once(d) = deadline {
                        until = Some(Instant::now() + d);
                    }
                }
                got += n;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if is_timeout(&e) && until.is_some() => return Err(late(deadline)),
            Err(e) => return Err(e.into()),
        }
    }
    let h = decode_header(&head, limit)?;
    body.clear();
    body.resize(h.len, 0);
    let mut tag = [0u8; TAG_LEN];
    for part in [&mut body[..], &mut tag[..]] {
        let mut at = 0;
        while at < part.len() {
            wait(r, until, deadline)?;
            match r.read(&mut part[at..]) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("connection closed inside a {}-byte frame body", h.len),
                    )
                    .into())
                }
                Ok(n) => at += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if is_timeout(&e) && until.is_some() => return Err(late(deadline)),
                Err(e) => return Err(e.into()),
            }
        }
    }
    if until.is_some() {
        // Whoever reads next sets their own limit; a frame's is over.
        r.set_read_timeout(None)?;
    }
    Ok((h, head, tag))
}

/// Gives the next read what is left of the deadline, or fails when nothing is.
fn wait(r: &mut (impl Timed + ?Sized), until: Option<Instant>, deadline: Deadline) -> Result<(), FrameError> {
    if let Some(t) = until {
        let left = t.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(late(deadline));
        }
        r.set_read_timeout(Some(left))?;
    }
    Ok(())
}

fn late(deadline: Deadline) -> FrameError {
    FrameError::Late(match deadline {
        Deadline::Once(d) => d,
        _ => Duration::ZERO,
    })
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
}

/// Reads one unauthenticated frame (a handshake's, or a test's), its tag ignored.
pub fn read_frame(r: &mut (impl Timed + ?Sized), limit: usize, body: &mut Vec<u8>) -> Result<FrameHeader, FrameError> {
    read_frame_by(r, limit, body, Deadline::None).map(|(h, _, _)| h)
}

/// Writes one frame with `tag(header, body)` after its body (header, body and tag in one write, so a small
/// frame is one segment with TCP_NODELAY). `tag` sees the body as it will be sent, and may change it in place
/// (an encrypting session does).
pub fn write_frame_tagged(
    w: &mut impl Write,
    kind: Kind,
    id: u64,
    body: &[u8],
    scratch: &mut Vec<u8>,
    tag: impl FnOnce(&[u8], &mut [u8]) -> [u8; TAG_LEN],
) -> io::Result<()> {
    let len =
        u32::try_from(body.len()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame body over 4 GiB"))?;
    let header = encode_header(&FrameHeader {
        kind,
        id,
        len: len as usize,
    });
    scratch.clear();
    scratch.extend_from_slice(&header);
    scratch.extend_from_slice(body);
    let (head, sent) = scratch.split_at_mut(HEADER_LEN);
    let t = tag(head, sent);
    scratch.extend_from_slice(&t);
    w.write_all(scratch)?;
    w.flush()
}

/// Writes one unauthenticated frame (a handshake's): its tag is zeros.
pub fn write_frame(w: &mut impl Write, kind: Kind, id: u64, body: &[u8], scratch: &mut Vec<u8>) -> io::Result<()> {
    write_frame_tagged(w, kind, id, body, scratch, |_, _| [0; TAG_LEN])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: Kind, id: u64, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        write_frame(&mut out, kind, id, body, &mut Vec::new()).unwrap();
        out
    }

    #[test]
    fn round_trip() {
        let bytes = [frame(Kind::Compute, 7, b"hello"), frame(Kind::Ping, u64::MAX, b"")].concat();
        let mut r = &bytes[..];
        let mut body = Vec::new();
        let h = read_frame(&mut r, 100, &mut body).unwrap();
        assert_eq!((h.kind, h.id, &body[..]), (Kind::Compute, 7, &b"hello"[..]));
        let h = read_frame(&mut r, 100, &mut body).unwrap();
        assert_eq!((h.kind, h.id, body.len()), (Kind::Ping, u64::MAX, 0));
        assert!(matches!(read_frame(&mut r, 100, &mut body), Err(FrameError::Closed)));
    }

    #[test]
    fn oversized_frame_is_refused_before_allocating() {
        let mut bytes = frame(Kind::Compute, 1, b"");
        bytes[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
        let mut body = Vec::new();
        let e = read_frame(&mut &bytes[..], 1 << 20, &mut body).unwrap_err();
        assert!(
            matches!(e, FrameError::TooLarge { len, .. } if len == u32::MAX as u64),
            "{e}"
        );
        assert_eq!(body.capacity(), 0);
    }

    #[test]
    fn malformed_headers_are_named() {
        let good = frame(Kind::Hello, 1, b"x");
        let cases: [(usize, u8, &str); 4] = [
            (0, b'X', "magic"),
            (4, 9, "version"),
            (5, 200, "kind"),
            (6, 1, "reserved"),
        ];
        for (at, v, what) in cases {
            let mut b = good.clone();
            b[at] = v;
            let e = read_frame(&mut &b[..], 100, &mut Vec::new()).unwrap_err().to_string();
            assert!(e.contains(what), "{e}");
        }
        // Truncated inside the header and inside the body.
        assert!(read_frame(&mut &good[..10], 100, &mut Vec::new())
            .unwrap_err()
            .to_string()
            .contains("header"));
        assert!(read_frame(&mut &good[..HEADER_LEN], 100, &mut Vec::new())
            .unwrap_err()
            .to_string()
            .contains("body"));
    }

    /// An I/O error reads once, whether shown alone or with its sources (as `anyhow`'s `{:#}` does).
    #[test]
    fn an_io_error_is_named_once() {
        let e = FrameError::from(io::Error::from(io::ErrorKind::ConnectionReset));
        let os = io::Error::from(io::ErrorKind::ConnectionReset).to_string();
        let mut chain = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            chain = format!("{chain}: {s}");
            source = s.source();
        }
        assert_eq!(chain.matches(&os).count(), 1, "{chain}");
    }

    #[test]
    fn random_bytes_never_panic() {
        // A small deterministic fuzz: every prefix of many pseudo-random streams decodes or errors.
        let mut s = 0x9e3779b97f4a7c15u64;
        for _ in 0..2000 {
            let mut b: Vec<u8> = (0..64)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    s as u8
                })
                .collect();
            if s.is_multiple_of(2) {
                b[..4].copy_from_slice(&MAGIC);
                b[4] = VERSION;
            }
            let mut r = &b[..];
            while read_frame(&mut r, 32, &mut Vec::new()).is_ok() {}
        }
    }
}
