//! Proving, in both directions, that the other end knows the node token — without the token ever crossing
//! the wire — and deriving each connection's session key.
//!
//! The backbone's hello carries a fresh nonce; the node answers with its own nonce and a proof, a keyed
//! BLAKE3 of both nonces and the model under a key derived from the token; only if that proof holds does the
//! backbone answer with its own proof (over the same values, another label), and only then does the node
//! send its welcome, the first frame under the session's MAC. An impostor at a node's address cannot make
//! the node's proof, so it learns nothing — not the token, not a byte of activations — and a relay that
//! passes the handshake through still cannot alter, inject or replay a frame after it. The slice endpoint's
//! HTTP requests and its assignment carry MACs under another key derived from the same token.

use std::io::{self, Read};

/// What a connection's proofs and keys are computed with: the node token, through a key derivation, so
/// that the token itself is used for nothing else.
#[derive(Clone)]
pub struct Keys {
    cluster: [u8; 32],
    http: [u8; 32],
}

pub type Nonce = [u8; 32];

impl Keys {
    pub fn new(token: &[u8]) -> Keys {
        Keys {
            cluster: blake3::derive_key("titan 2026-12 cluster data plane", token),
            http: blake3::derive_key("titan 2026-12 cluster slice endpoint", token),
        }
    }

    /// The keyed hash of `parts` under `key`, each part length-prefixed so that no two lists of parts hash
    /// alike.
    fn mac(key: &[u8; 32], label: &str, parts: &[&[u8]]) -> [u8; 32] {
        let mut h = blake3::Hasher::new_keyed(key);
        for p in std::iter::once(label.as_bytes()).chain(parts.iter().copied()) {
            h.update(&(p.len() as u64).to_le_bytes()).update(p);
        }
        *h.finalize().as_bytes()
    }

    /// The node's proof for the backbone's nonce `b`, its own `n`, the model both run and whether the
    /// session is encrypted (so that nobody on the path can turn encryption off unnoticed).
    pub fn node_proof(&self, b: &Nonce, n: &Nonce, model: &str, encrypt: bool) -> [u8; 32] {
        Self::mac(&self.cluster, "node", &[b, n, model.as_bytes(), &[encrypt as u8]])
    }

    /// The backbone's proof, over the same values.
    pub fn backbone_proof(&self, b: &Nonce, n: &Nonce, model: &str, encrypt: bool) -> [u8; 32] {
        Self::mac(&self.cluster, "backbone", &[b, n, model.as_bytes(), &[encrypt as u8]])
    }

    /// The connection's session key (its frames' MACs, or their encryption's key).
    pub fn session_key(&self, b: &Nonce, n: &Nonce, model: &str, encrypt: bool) -> [u8; 32] {
        Self::mac(&self.cluster, "session", &[b, n, model.as_bytes(), &[encrypt as u8]])
    }

    /// The MAC of an HTTP request to the slice endpoint: its method, path and query, the time and nonce it
    /// was made with, and its body.
    pub fn request_mac(&self, method: &str, target: &str, time: u64, nonce: &Nonce, body: &[u8]) -> [u8; 32] {
        let hash = blake3::hash(body);
        let parts: [&[u8]; 5] = [
            method.as_bytes(),
            target.as_bytes(),
            &time.to_le_bytes(),
            nonce,
            hash.as_bytes(),
        ];
        Self::mac(&self.http, "request", &parts)
    }

    /// The MAC of the endpoint's answer to the request of `nonce`: the node trusts an assignment (and the
    /// digests in it) only with it.
    pub fn answer_mac(&self, nonce: &Nonce, body: &[u8]) -> [u8; 32] {
        Self::mac(&self.http, "answer", &[nonce, blake3::hash(body).as_bytes()])
    }
}

/// How far a request's time may be from the endpoint's clock, either way, in seconds.
pub const REQUEST_SKEW: u64 = 300;

/// What a request to the slice endpoint presents in its `Authorization` header: `Titan time=T, nonce=N,
/// mac=M` (seconds since the epoch, 64 hex digits, 64 hex digits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Signed {
    pub time: u64,
    pub nonce: Nonce,
    pub mac: [u8; 32],
}

impl Signed {
    /// Signs a request of `method` to `target` (path and query) with `body`, now, with a fresh nonce.
    pub fn new(keys: &Keys, method: &str, target: &str, body: &[u8]) -> io::Result<Signed> {
        let time = now();
        let nonce = nonce()?;
        Ok(Signed {
            time,
            nonce,
            mac: keys.request_mac(method, target, time, &nonce, body),
        })
    }

    /// The header's value.
    pub fn header(&self) -> String {
        format!(
            "Titan time={}, nonce={}, mac={}",
            self.time,
            hex(&self.nonce),
            hex(&self.mac)
        )
    }

    /// Reads a header's value; `None` unless it is one.
    pub fn parse(v: &str) -> Option<Signed> {
        let mut fields = v.strip_prefix("Titan ")?.split(", ");
        let mut field = |name: &str| fields.next()?.strip_prefix(name)?.strip_prefix('=');
        let time = field("time")?.parse().ok()?;
        let nonce = unhex(field("nonce")?)?;
        let mac = unhex(field("mac")?)?;
        Some(Signed { time, nonce, mac })
    }

    /// Whether this signs a request of `method` to `target` with `body`, made within [`REQUEST_SKEW`] of
    /// now. (That its nonce is new is the endpoint's to check.)
    pub fn signs(&self, keys: &Keys, method: &str, target: &str, body: &[u8]) -> bool {
        let fresh = now().abs_diff(self.time) <= REQUEST_SKEW;
        let mac = keys.request_mac(method, target, self.time, &self.nonce, body);
        // Both always computed, compared in constant time.
        same(&mac, &self.mac) & fresh
    }
}

/// Seconds since the epoch (0 on a clock set before it, which no request then passes).
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Whether two proofs or MACs are equal, in constant time.
pub fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    titan_net::secrets_equal(a, b)
}

/// 32 bytes from the operating system's generator: never the same twice, never guessable.
pub fn nonce() -> io::Result<Nonce> {
    let mut n = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut n)?;
    Ok(n)
}

/// Hex, as nonces and proofs travel in JSON.
pub fn hex(b: &[u8; 32]) -> String {
    blake3::Hash::from_bytes(*b).to_hex().to_string()
}

/// 32 bytes from 64 hex digits, if they are.
pub fn unhex(s: &str) -> Option<[u8; 32]> {
    blake3::Hash::from_hex(s).ok().map(|h| *h.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Proofs bind the token, both nonces, the model and the role: change any and the proof changes.
    #[test]
    fn proofs_depend_on_everything_they_cover() {
        let (k, other) = (Keys::new(b"0123456789abcdef"), Keys::new(b"0123456789abcdeg"));
        let (b, n) = ([1u8; 32], [2u8; 32]);
        let p = k.node_proof(&b, &n, "m", false);
        assert!(same(&p, &k.node_proof(&b, &n, "m", false)));
        for q in [
            other.node_proof(&b, &n, "m", false),
            k.node_proof(&n, &b, "m", false),
            k.node_proof(&b, &n, "m2", false),
            k.node_proof(&b, &n, "m", true),
            k.backbone_proof(&b, &n, "m", false),
            k.session_key(&b, &n, "m", false),
        ] {
            assert!(!same(&p, &q));
        }
        assert_eq!(unhex(&hex(&p)), Some(p));
        // A signed request: read back from its header, it signs exactly what it was made for.
        let signed = Signed::new(&k, "GET", "/v1/slice?node=a", b"").unwrap();
        let read = Signed::parse(&signed.header()).unwrap();
        assert_eq!(read, signed);
        assert!(read.signs(&k, "GET", "/v1/slice?node=a", b""));
        assert!(!read.signs(&k, "GET", "/v1/slice?node=b", b""));
        assert!(!read.signs(&k, "POST", "/v1/slice?node=a", b""));
        assert!(!read.signs(&k, "GET", "/v1/slice?node=a", b"x"));
        assert!(!read.signs(&other, "GET", "/v1/slice?node=a", b""));
        let stale = Signed {
            time: now() - REQUEST_SKEW - 5,
            ..signed
        };
        let stale = Signed {
            mac: k.request_mac("GET", "/v1/slice?node=a", stale.time, &stale.nonce, b""),
            ..stale
        };
        assert!(!stale.signs(&k, "GET", "/v1/slice?node=a", b""));
        assert!(Signed::parse("Bearer abc").is_none());
        assert!(unhex("not hex").is_none());
        assert_ne!(nonce().unwrap(), nonce().unwrap());
    }
}
