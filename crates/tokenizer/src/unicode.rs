//! Character classes for the pre-tokenizers, and GPT-2's byte <-> unicode mapping.
//!
//! llama.cpp classifies codepoints with its own Unicode tables (`unicode-data.cpp`):
//! `\p{L}` is general category L*, `\p{N}` is N*, `\s` is the White_Space property.
//! Rust's `char::is_numeric` is exactly N* and `char::is_whitespace` exactly White_Space;
//! for L* we take the ranges regex-syntax uses for `\p{L}`, so the hand-written splitters
//! and the regex stages agree on every codepoint.

use std::sync::OnceLock;

/// Sorted, disjoint inclusive ranges of general category L.
fn letter_ranges() -> &'static [(u32, u32)] {
    static RANGES: OnceLock<Vec<(u32, u32)>> = OnceLock::new();
    RANGES.get_or_init(|| {
        use regex_syntax::hir::{Class, HirKind};
        // A constant pattern: parsing cannot fail; an empty table would fail the unit tests.
        let Ok(hir) = regex_syntax::Parser::new().parse(r"\p{L}") else {
            return Vec::new();
        };
        match hir.kind() {
            HirKind::Class(Class::Unicode(class)) => class
                .ranges()
                .iter()
                .map(|r| (r.start() as u32, r.end() as u32))
                .collect(),
            _ => Vec::new(),
        }
    })
}

pub(crate) fn is_letter(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_alphabetic();
    }
    let cp = c as u32;
    let ranges = letter_ranges();
    // Index of the first range starting after cp; the candidate is the one before it.
    let idx = ranges.partition_point(|&(start, _)| start <= cp);
    idx > 0 && cp <= ranges[idx - 1].1
}

pub(crate) fn is_number(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_digit();
    }
    c.is_numeric()
}

pub(crate) fn is_whitespace(c: char) -> bool {
    c.is_whitespace()
}

/// GPT-2's reversible byte -> printable character table: printable Latin-1 bytes map to
/// themselves, the other 68 bytes to U+0100.. in byte order.
pub(crate) fn byte_to_char_table() -> &'static [char; 256] {
    static TABLE: OnceLock<[char; 256]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = ['\0'; 256];
        let mut next = 256u32;
        for (b, slot) in table.iter_mut().enumerate() {
            let printable = (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
            let cp = if printable {
                b as u32
            } else {
                next += 1;
                next - 1
            };
            *slot = char::from_u32(cp).unwrap_or('\u{FFFD}');
        }
        table
    })
}

/// Inverse of [`byte_to_char_table`]; `None` for characters outside the mapping.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    let cp = c as u32;
    match cp {
        0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF => Some(cp as u8),
        0x100..=0x143 => {
            let table = byte_to_char_table();
            table.iter().position(|&t| t == c).map(|b| b as u8)
        }
        _ => None,
    }
}

/// Byte-level encoding of a pre-tokenized word: every UTF-8 byte becomes its GPT-2 char.
pub(crate) fn byte_encode(word: &str) -> String {
    let table = byte_to_char_table();
    word.bytes().map(|b| table[b as usize]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn letter_table_is_loaded_and_classifies() {
        assert!(!letter_ranges().is_empty());
        for c in ['a', 'Z', 'é', 'ж', '中', 'ー', 'ǅ'] {
            assert!(is_letter(c), "{c:?} should be a letter");
        }
        for c in ['1', ' ', '!', '\u{0301}', '٣', '€'] {
            assert!(!is_letter(c), "{c:?} should not be a letter");
        }
        assert!(is_number('٣') && is_number('Ⅻ') && is_number('½') && !is_number('a'));
        assert!(is_whitespace('\u{3000}') && is_whitespace('\u{85}') && !is_whitespace('\u{200B}'));
    }

    #[test]
    fn gpt2_byte_table_round_trips() {
        let table = byte_to_char_table();
        assert_eq!(table[b' ' as usize], 'Ġ');
        assert_eq!(table[b'\n' as usize], 'Ċ');
        assert_eq!(table[b'a' as usize], 'a');
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(table[b as usize]), Some(b));
        }
        assert_eq!(char_to_byte('中'), None);
    }
}
