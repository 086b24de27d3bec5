//! The byte forms every record of the index is made of: varints,
//! length-prefixed bytes, zigzag numbers, role codes.

use crate::protocol::messages::Role;

pub(super) fn role_code(r: Role) -> u8 {
    match r {
        Role::User => 0,
        Role::Assistant => 1,
        Role::Tool => 2,
    }
}

pub(super) fn role_of(b: u8) -> Option<Role> {
    match b {
        0 => Some(Role::User),
        1 => Some(Role::Assistant),
        2 => Some(Role::Tool),
        _ => None,
    }
}

pub(super) fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

pub(super) fn unzigzag(z: u64) -> i64 {
    ((z >> 1) as i64) ^ -((z & 1) as i64)
}

pub(super) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(super) fn varint(p: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    let mut shift = 0;
    loop {
        let b = *p.get(*at)?;
        *at += 1;
        if shift > 63 {
            return None;
        }
        v |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return Some(v);
        }
        shift += 7;
    }
}

pub(super) fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

pub(super) fn bytes<'a>(p: &'a [u8], at: &mut usize) -> Option<&'a [u8]> {
    let n = usize::try_from(varint(p, at)?).ok()?;
    let end = at.checked_add(n)?;
    let b = p.get(*at..end)?;
    *at = end;
    Some(b)
}

#[cfg(test)]
mod tests {
    use super::super::batch::decode_batch;
    use super::*;
    #[test]
    fn varints_round_trip_and_refuse_garbage() {
        let mut v = Vec::new();
        for n in [0u64, 1, 127, 128, 300, u64::MAX] {
            put_varint(&mut v, n);
        }
        let mut at = 0;
        for n in [0u64, 1, 127, 128, 300, u64::MAX] {
            assert_eq!(varint(&v, &mut at), Some(n));
        }
        assert_eq!(varint(&[0xff; 20], &mut 0), None);
        assert!(decode_batch(&[0xff; 40], 10).is_none());
    }
}
