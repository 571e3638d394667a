//! A man in the middle on loopback: a relay between a backbone and a node that reads the node's answers
//! frame by frame and, on the first connection that has enough of them, alters, replays or trickles one of them — what
//! someone on the network path could do without the token. Every other byte, the handshake included, is
//! relayed as it came.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use titan_net::{Kind, HEADER_LEN, TAG_LEN};

/// What is done to the node's `nth` Output frame (counting from 0) of a connection, once.
#[derive(Clone, Copy, Debug)]
pub enum Tamper {
    /// One bit of the body flipped in the middle of it.
    Alter { nth: usize },
    /// The frame replaced by the Output frame before it, sent again byte for byte.
    Replay { nth: usize },
    /// The header and the first body byte sent, then one more byte a second.
    Trickle { nth: usize },
    /// Nothing changed: every byte the node sends is kept, as an eavesdropper would.
    Record,
}

pub struct Relay {
    pub addr: String,
    done: Arc<AtomicBool>,
    heard: Arc<std::sync::Mutex<Vec<u8>>>,
}

impl Relay {
    pub fn start(target: &str, tamper: Tamper) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let done = Arc::new(AtomicBool::new(false));
        let heard = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (target, flag, ear) = (target.to_string(), done.clone(), heard.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(&target) else {
                    continue;
                };
                let tamper = (!flag.load(Ordering::SeqCst)).then_some(tamper);
                let (c, s) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || copy(c, s));
                let (flag, ear) = (flag.clone(), ear.clone());
                std::thread::spawn(move || answers(server, client, tamper, &flag, &ear));
            }
        });
        Relay { addr, done, heard }
    }

    /// Every byte the node sent, over every connection (with [`Tamper::Record`]).
    pub fn heard(&self) -> Vec<u8> {
        self.heard.lock().unwrap().clone()
    }

    /// Whether the tampering happened (a test that tampered with nothing would prove nothing).
    pub fn tampered(&self) -> bool {
        self.done.load(Ordering::SeqCst)
    }
}

/// The backbone's bytes to the node, unchanged.
fn copy(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Write);
}

/// The node's frames to the backbone, one at a time, the chosen one tampered with.
fn answers(
    mut from: TcpStream,
    mut to: TcpStream,
    tamper: Option<Tamper>,
    done: &AtomicBool,
    heard: &std::sync::Mutex<Vec<u8>>,
) {
    let (mut outputs, mut last_output) = (0, Vec::new());
    loop {
        let mut frame = vec![0u8; HEADER_LEN];
        if from.read_exact(&mut frame).is_err() {
            break;
        }
        let len = u32::from_le_bytes(frame[16..20].try_into().unwrap()) as usize;
        frame.resize(HEADER_LEN + len + TAG_LEN, 0);
        if from.read_exact(&mut frame[HEADER_LEN..]).is_err() {
            break;
        }
        if let Some(Tamper::Record) = tamper {
            heard.lock().unwrap().extend_from_slice(&frame);
        }
        let mut out = frame.clone();
        if frame[5] == Kind::Output as u8 {
            match tamper {
                Some(Tamper::Alter { nth }) if outputs == nth && !done.swap(true, Ordering::SeqCst) => {
                    out[HEADER_LEN + len / 2] ^= 0x01;
                }
                Some(Tamper::Replay { nth }) if outputs == nth && !done.swap(true, Ordering::SeqCst) => {
                    assert!(!last_output.is_empty(), "nothing to replay before Output frame {nth}");
                    out = last_output.clone();
                }
                Some(Tamper::Trickle { nth }) if outputs == nth && !done.swap(true, Ordering::SeqCst) => {
                    for byte in &out[..HEADER_LEN + 1] {
                        if to.write_all(std::slice::from_ref(byte)).is_err() {
                            return;
                        }
                    }
                    for byte in &out[HEADER_LEN + 1..] {
                        std::thread::sleep(Duration::from_secs(1));
                        if to.write_all(std::slice::from_ref(byte)).is_err() {
                            break;
                        }
                    }
                    return;
                }
                _ => {}
            }
            outputs += 1;
            last_output = frame;
        }
        if to.write_all(&out).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
