//! A TCP relay on loopback that cuts one connection at a chosen byte, so a test can break a real
//! connection between two real processes in the middle of a frame or of an HTTP body: the first connection
//! to reach the cut point is cut; every other one (a redial, a resumed download) is relayed whole.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Where the connection is cut.
#[derive(Clone, Copy, Debug)]
pub enum Cut {
    /// `into` bytes into the first TITAN frame of `kind` (whose payload must be longer), in the direction
    /// from the dialled side (`replies: true`) or towards it.
    MidFrame {
        replies: bool,
        kind: titan_net::Kind,
        into: usize,
    },
    /// After `bytes` bytes from the dialled side (an HTTP response: headers, then part of the body).
    Replies { bytes: usize },
}

pub struct Cutter {
    pub addr: String,
    cut: Arc<AtomicBool>,
}

impl Cutter {
    /// Relays connections to `target`, cutting the first to reach `cut`.
    pub fn start(target: &str, cut: Cut) -> Cutter {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let done = Arc::new(AtomicBool::new(false));
        let (target, flag) = (target.to_string(), Arc::clone(&done));
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                // A target not listening yet: the client sees its connection close, as if refused.
                let Ok(server) = TcpStream::connect(&target) else {
                    continue;
                };
                let cut = (!flag.load(Ordering::SeqCst)).then_some(cut);
                relay(client, server, cut, Arc::clone(&flag));
            }
        });
        Cutter { addr, cut: done }
    }

    /// Whether the cut happened (a test that cut nothing would prove nothing).
    pub fn has_cut(&self) -> bool {
        self.cut.load(Ordering::SeqCst)
    }
}

type Limit = Box<dyn FnMut(&[u8]) -> Option<usize> + Send>;

/// Two pumps, one per direction; the one the cut applies to stops at its byte and shuts both sockets.
fn relay(client: TcpStream, server: TcpStream, cut: Option<Cut>, done: Arc<AtomicBool>) {
    let (towards, replies): (Option<Limit>, Option<Limit>) = match cut {
        None => (None, None),
        Some(Cut::Replies { bytes }) => (None, Some(Box::new(after_bytes(bytes)))),
        Some(Cut::MidFrame {
            replies: true,
            kind,
            into,
        }) => (None, Some(Box::new(mid_frame(kind, into)))),
        Some(Cut::MidFrame {
            replies: false,
            kind,
            into,
        }) => (Some(Box::new(mid_frame(kind, into))), None),
    };
    let sockets = Arc::new([client.try_clone().unwrap(), server.try_clone().unwrap()]);
    let (c, s, socks, d) = (
        client.try_clone().unwrap(),
        server.try_clone().unwrap(),
        Arc::clone(&sockets),
        Arc::clone(&done),
    );
    std::thread::spawn(move || pump(c, s, towards, &socks, &d));
    std::thread::spawn(move || pump(server, client, replies, &sockets, &done));
}

/// Copies `from` to `to`; `limit` sees all bytes so far and says where to stop, if within them.
fn pump(mut from: TcpStream, mut to: TcpStream, mut limit: Option<Limit>, sockets: &[TcpStream; 2], done: &AtomicBool) {
    let (mut seen, mut buf) = (Vec::new(), [0u8; 4096]);
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(at) = limit.as_mut() {
            let before = seen.len();
            seen.extend_from_slice(&buf[..n]);
            if let Some(stop) = at(&seen) {
                if done.swap(true, Ordering::SeqCst) {
                    // Another connection was cut already: relay this one whole.
                    limit = None;
                } else {
                    let _ = to.write_all(&buf[..stop.saturating_sub(before).min(n)]);
                    for s in sockets.iter() {
                        let _ = s.shutdown(Shutdown::Both);
                    }
                    return;
                }
            }
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

fn after_bytes(bytes: usize) -> impl FnMut(&[u8]) -> Option<usize> + Send {
    move |seen| (seen.len() >= bytes).then_some(bytes)
}

/// Stops `into` bytes into the first frame of `kind`, walking the frames by their headers (20 bytes: the
/// kind at 5, the payload length little-endian at 16..20; the payload, then a 16-byte tag); panics if that
/// frame is too short to cut inside.
fn mid_frame(kind: titan_net::Kind, into: usize) -> impl FnMut(&[u8]) -> Option<usize> + Send {
    move |seen| {
        let mut at = 0;
        loop {
            let header = seen.get(at..at + 20)?;
            let len = u32::from_le_bytes(header[16..20].try_into().unwrap()) as usize;
            if header[5] == kind as u8 {
                assert!(
                    into < 20 + len,
                    "a {kind:?} frame of {len} payload bytes: cutting {into} bytes in would cut between frames"
                );
                return (seen.len() >= at + into).then_some(at + into);
            }
            at += 20 + len + titan_net::TAG_LEN;
        }
    }
}
