//! FNV-1a over byte strings: a small, stable hash. Impairments derive a
//! bridge's seed and each pair's drop stream from it; the uplink names its
//! subnet and interfaces with it, and the harness a NIC's MAC. It is a
//! general hash, so it has a module of its own rather than living in
//! `impair` (which re-exports it for its callers).
//!
//! Stable across versions and platforms by construction (unlike `std`'s
//! hashers), which reproducing a recorded run needs: a pin test holds the
//! empty input's value.

/// FNV-1a (64-bit) over `parts`, each followed by a separator byte so
/// `("ab", "c")` and `("a", "bc")` differ.
pub fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in *part {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        // Separator so ("ab","c") and ("a","bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_separated_and_the_empty_input_is_pinned() {
        assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]));
        assert_eq!(fnv1a(&[]), 0xcbf2_9ce4_8422_2325);
        assert_ne!(fnv1a(&[b""]), fnv1a(&[]), "an empty part still counts");
    }
}
