//! The `oop` engine's self-checking slot words: damage to a slot is a typed error at
//! recovery, never a word silently read from the wrong copy or the wrong home.
//!
//! A slot `{home, value, txid of the slot copy, txid of the home copy}` is stored one
//! 8-byte word at a time, and a crash may persist any prefix of a line's stores, so a
//! check spanning words could be torn by a crash as well as by damage, and the two
//! could not be told apart. Each word that recovery trusts therefore carries its own
//! check, in bits the payload never uses:
//! - a transaction id (`version << 8 | thread`, versions below 2^48) keeps a CRC-8 of
//!   its seven low bytes in its top byte;
//! - the home word keeps the home address (below 2^40, the heap's limit) in its low 40
//!   bits, a CRC-16 of them above, and in its top byte a CRC-8 of the slot's value and
//!   transaction id. The home word is stored after the value and the id, so when the
//!   slot copy is the current one (its transaction committed, so its whole line
//!   persisted) the value check holds; when it is not, the value may be legitimately
//!   torn and is never read.
//!
//! A CRC of degree `n` detects every burst of at most `n` bits, so every single-byte
//! change of a word is caught (the tests check it exhaustively). The CRCs come from the
//! `crc` crate.
//!
//! The zero word stays zero (a free slot's home, a home copy never written), so a
//! zeroed chunk needs no sealing.

use crc::{CRC_8_SMBUS, CRC_16_IBM_3740, Crc};

const CRC8: Crc<u8> = Crc::<u8>::new(&CRC_8_SMBUS);
const CRC16: Crc<u16> = Crc::<u16>::new(&CRC_16_IBM_3740);

/// Bits of a transaction id's payload.
const TXID_BITS: u32 = 56;
/// The first transaction version a slot cannot hold (2^48: about 325 days of
/// commits at ten million a second).
pub(crate) const VERSION_LIMIT: u64 = 1 << 48;
/// Bits of a home address in the home word.
const HOME_BITS: u32 = 40;
const HOME_MASK: u64 = (1 << HOME_BITS) - 1;

/// `txid` (below 2^56) with its check.
pub(crate) fn seal_txid(txid: u64) -> u64 {
    debug_assert!(txid >> TXID_BITS == 0, "a transaction id past 56 bits");
    if txid == 0 {
        return 0;
    }
    let check = CRC8.checksum(&txid.to_le_bytes()[..7]);
    u64::from(check) << TXID_BITS | txid
}

/// The transaction id in a sealed word, or `None` when its check fails.
pub(crate) fn open_txid(word: u64) -> Option<u64> {
    let txid = word & ((1 << TXID_BITS) - 1);
    (seal_txid(txid) == word).then_some(txid)
}

/// The check of a slot copy: its value and its sealed transaction id.
fn value_check(value: u64, sealed_txid: u64) -> u8 {
    let mut digest = CRC8.digest();
    digest.update(&value.to_le_bytes());
    digest.update(&sealed_txid.to_le_bytes());
    digest.finalize()
}

/// The home word of a slot for `home` (below 2^40) whose copy is `value` written by
/// the transaction `sealed_txid`.
pub(crate) fn seal_home(home: u64, value: u64, sealed_txid: u64) -> u64 {
    debug_assert!(home >> HOME_BITS == 0 && home != 0, "a home past 40 bits");
    let home_check = CRC16.checksum(&home.to_le_bytes()[..5]);
    u64::from(value_check(value, sealed_txid)) << 56 | u64::from(home_check) << HOME_BITS | home
}

/// A home word read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Home {
    /// Zero: the slot is free.
    Free,
    /// The word's home, and whether the slot's value and transaction id match the check
    /// stored with it.
    At { home: u64, copy_intact: bool },
    /// The word's own check fails.
    Damaged,
}

/// Reads a home word, checking the slot copy `value`, `sealed_txid` against it.
pub(crate) fn open_home(word: u64, value: u64, sealed_txid: u64) -> Home {
    if word == 0 {
        return Home::Free;
    }
    let home = word & HOME_MASK;
    let home_check = CRC16.checksum(&home.to_le_bytes()[..5]);
    if home == 0 || (word >> HOME_BITS) as u16 != home_check {
        return Home::Damaged;
    }
    Home::At {
        home,
        copy_intact: (word >> 56) as u8 == value_check(value, sealed_txid),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every way of changing one byte of `word` (255 per byte).
    fn single_byte_changes(word: u64) -> impl Iterator<Item = u64> {
        (0..8).flat_map(move |byte| (1..=255u64).map(move |x| word ^ x << (8 * byte)))
    }

    #[test]
    fn transaction_ids_round_trip_and_catch_every_single_byte_change() {
        for txid in [1, 5 << 8 | 3, (VERSION_LIMIT - 1) << 8 | 239] {
            let word = seal_txid(txid);
            assert_eq!(open_txid(word), Some(txid));
            for damaged in single_byte_changes(word) {
                assert_eq!(open_txid(damaged), None, "{word:#x} -> {damaged:#x}");
            }
        }
        assert_eq!(seal_txid(0), 0);
        assert_eq!(open_txid(0), Some(0));
    }

    #[test]
    fn home_words_round_trip_and_catch_every_single_byte_change() {
        let (value, txid) = (0x0123_4567_89ab_cdef, seal_txid(7 << 8 | 1));
        for home in [8, 0x1000, (1 << 40) - 8] {
            let word = seal_home(home, value, txid);
            let intact = Home::At {
                home,
                copy_intact: true,
            };
            assert_eq!(open_home(word, value, txid), intact);
            for damaged in single_byte_changes(word) {
                let found = open_home(damaged, value, txid);
                assert!(
                    found == Home::Damaged
                        || found == Home::Free
                        || found
                            == Home::At {
                                home,
                                copy_intact: false
                            },
                    "{word:#x} -> {damaged:#x}: {found:?}"
                );
            }
        }
    }

    #[test]
    fn the_home_word_catches_every_single_byte_change_of_the_copy() {
        let (home, value, txid) = (0x4_0008, 42u64, seal_txid(9 << 8 | 2));
        let word = seal_home(home, value, txid);
        for changed in single_byte_changes(value) {
            assert_eq!(
                open_home(word, changed, txid),
                Home::At {
                    home,
                    copy_intact: false
                }
            );
        }
        for changed in single_byte_changes(txid) {
            assert!(matches!(
                open_home(word, value, changed),
                Home::At {
                    copy_intact: false,
                    ..
                }
            ));
        }
    }
}
