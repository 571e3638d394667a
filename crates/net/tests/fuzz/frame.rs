//! The `frame` fuzz target's body, shared by `fuzz/fuzz_targets/frame.rs` and
//! `tests/fuzz_corpus.rs`: a byte stream read frame after frame as a peer's socket is read, each
//! body then read field by field with the bounds-checked payload reader. The input's first bytes
//! choose the size limit and the field script (through `arbitrary`); the rest is the stream.

use arbitrary::{Arbitrary, Unstructured};
use titan_net::frame::{decode_header, encode_header};
use titan_net::{read_frame, PayloadReader, DEFAULT_MAX_FRAME, HEADER_LEN};

/// One read of a payload field.
#[derive(Arbitrary, Debug)]
enum Field {
    U32,
    /// A count of items of this many bytes.
    Count(u8),
    Bytes(u16),
}

pub fn run(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(limit) = u.choose(&[0, 16, 4096, DEFAULT_MAX_FRAME]).copied() else {
        return;
    };
    let Ok(n_fields) = u.int_in_range(0..=8u8) else {
        return;
    };
    let script: Vec<Field> = (0..n_fields).map_while(|_| Field::arbitrary(&mut u).ok()).collect();
    let stream = u.take_rest();

    let mut r = stream;
    let mut body = Vec::new();
    loop {
        let before = r;
        let Ok(h) = read_frame(&mut r, limit, &mut body) else {
            break;
        };
        // A frame that decoded is exactly what the encoder writes for its header, and its body.
        let head: &[u8; HEADER_LEN] = before[..HEADER_LEN].try_into().expect("a whole header was read");
        assert_eq!(&encode_header(&h), head);
        assert_eq!(decode_header(head, limit).ok(), Some(h));
        assert!(h.len <= limit && body.len() == h.len);
        assert_eq!(&before[HEADER_LEN..HEADER_LEN + h.len], &body[..]);
        read_fields(&body, &script);
    }
}

fn read_fields(body: &[u8], script: &[Field]) {
    let mut p = PayloadReader::new("fuzzed message", body);
    let mut left = body.len();
    for field in script {
        let taken = match *field {
            Field::U32 => p.u32().map(|_| 4),
            Field::Count(item) => p.count(item as usize).map(|n| {
                assert!(
                    n * (item as usize).max(1) <= left - 4,
                    "count {n} of {item}-byte items, {left} bytes left"
                );
                4
            }),
            Field::Bytes(n) => p.bytes(n as usize).map(|b| {
                assert_eq!(b.len(), n as usize);
                b.len()
            }),
        };
        match taken {
            Ok(n) => left -= n,
            Err(_) => return,
        }
    }
    assert_eq!(p.finish().is_ok(), left == 0);
}
