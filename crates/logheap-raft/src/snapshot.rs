//! The bytes of a snapshot's data: every key and value of the state machine, in key
//! order, each as a little-endian u32 length and its bytes.

/// Appends the pair `key`, `value` to `out`.
pub(crate) fn push_pair(out: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    for part in [key, value] {
        // Keys and values are at most `logheap_kv::MAX_LEN` (u32::MAX) bytes.
        out.extend_from_slice(&(part.len() as u32).to_le_bytes());
        out.extend_from_slice(part);
    }
}

/// A key and its value, borrowed from a snapshot's data.
pub(crate) type Pair<'a> = (&'a [u8], &'a [u8]);

/// The pairs of `data`, or why it is not a snapshot's data.
pub(crate) fn pairs(data: &[u8]) -> Result<Vec<Pair<'_>>, String> {
    fn take<'a>(rest: &mut &'a [u8]) -> Result<&'a [u8], String> {
        let (len, tail) = rest
            .split_first_chunk::<4>()
            .ok_or("a snapshot's data ends inside a length")?;
        let len = u32::from_le_bytes(*len) as usize;
        if tail.len() < len {
            return Err("a snapshot's data ends inside a key or value".to_string());
        }
        let (part, tail) = tail.split_at(len);
        *rest = tail;
        Ok(part)
    }
    let mut out = Vec::new();
    let mut rest = data;
    while !rest.is_empty() {
        let key = take(&mut rest)?;
        let value = take(&mut rest)?;
        if out.last().is_some_and(|&(k, _): &Pair<'_>| k >= key) {
            return Err("a snapshot's keys are not in order".to_string());
        }
        out.push((key, value));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_round_trip_and_bad_bytes_are_refused() {
        let mut data = Vec::new();
        push_pair(&mut data, b"a", b"");
        push_pair(&mut data, b"b", b"value");
        assert_eq!(
            pairs(&data).unwrap(),
            vec![(&b"a"[..], &b""[..]), (&b"b"[..], &b"value"[..])]
        );
        assert!(pairs(&[]).unwrap().is_empty());
        // Cut anywhere but between the two pairs (after 4 + 1 + 4 bytes).
        for cut in (1..data.len()).filter(|&cut| cut != 9) {
            assert!(pairs(&data[..cut]).is_err(), "cut at {cut}");
        }
        let mut unordered = Vec::new();
        push_pair(&mut unordered, b"b", b"");
        push_pair(&mut unordered, b"a", b"");
        assert!(pairs(&unordered).is_err());
    }
}
