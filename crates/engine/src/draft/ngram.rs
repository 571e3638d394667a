//! Prompt lookup: the tokens that followed the last place the text's most recent few tokens occurred
//! before. No weights at all; it pays where the output repeats its input (code edits, quoting, lists,
//! structured output), and drafts nothing elsewhere.

use super::Drafter;
use crate::Result;

/// Matches the last `max_n` tokens of the history, then fewer, down to `min_n`, against everything before
/// them; the most recent occurrence of the longest match wins.
#[derive(Clone, Debug)]
pub struct NgramDrafter {
    pub min_n: usize,
    pub max_n: usize,
}

impl Default for NgramDrafter {
    /// Two to four tokens: a single repeated token predicts too little to be worth a verify row.
    fn default() -> Self {
        NgramDrafter { min_n: 2, max_n: 4 }
    }
}

impl Drafter for NgramDrafter {
    fn draft(&mut self, history: &[u32], max: usize, out: &mut Vec<u32>) -> Result<()> {
        out.clear();
        if max == 0 {
            return Ok(());
        }
        for n in (self.min_n.max(1)..=self.max_n).rev() {
            if n >= history.len() {
                continue;
            }
            let tail = &history[history.len() - n..];
            // Latest start first; a match must leave at least one token after it.
            let found = (0..history.len() - n).rev().find(|&i| &history[i..i + n] == tail);
            if let Some(i) = found {
                let next = &history[i + n..];
                out.extend_from_slice(&next[..next.len().min(max)]);
                return Ok(());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draft(history: &[u32], max: usize) -> Vec<u32> {
        let mut out = vec![99];
        NgramDrafter::default().draft(history, max, &mut out).unwrap();
        out
    }

    #[test]
    fn the_longest_most_recent_match_gives_what_followed_it() {
        // "3 4" occurs twice before the end; the later one is followed by 9 9.
        assert_eq!(draft(&[1, 3, 4, 5, 6, 3, 4, 9, 9, 0, 3, 4], 8), [9, 9, 0, 3, 4]);
        // "2 3 4" beats the more recent "3 4".
        assert_eq!(draft(&[2, 3, 4, 7, 3, 4, 8, 2, 3, 4], 2), [7, 3]);
        assert_eq!(draft(&[1, 2, 3, 1, 2], 1), [3]);
    }

    #[test]
    fn no_match_no_draft() {
        assert!(draft(&[1, 2, 3, 4, 5], 4).is_empty());
        assert!(draft(&[7], 4).is_empty());
        assert!(draft(&[1, 2, 1, 2], 0).is_empty());
        // A single repeated token is below the shortest n-gram.
        assert!(draft(&[5, 1, 2, 5], 4).is_empty());
    }
}
