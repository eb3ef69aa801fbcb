//! A small DER walk over X.509 certificates: the subject (for the kubelet
//! API's users) and the validity (for bootstrap and rotation). The chain
//! itself is verified by rustls; reading two fields does not need a full
//! X.509 parser and its weight in the static binary.

/// An X.509 certificate's subject as the kubelet API reads a client
/// certificate's: the common name and the organizations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Subject {
    pub common_name: String,
    pub organizations: Vec<String>,
}

/// The subject of an X.509 certificate (its CN and O entries); `None`
/// without a CN.
/// (The certificate's chain is already verified by rustls; only the
/// subject is read here, so a small DER walk does instead of a full X.509
/// parser and its weight in the static binary.)
pub fn subject_of_cert(der: &[u8]) -> Option<Subject> {
    // Certificate ::= SEQUENCE { tbsCertificate SEQUENCE { [0] version?,
    //   serial, signature, issuer, validity, subject, ... } ... }
    let (cert, _) = tlv(der, 0x30)?;
    let (mut tbs, _) = tlv(cert, 0x30)?;
    if tbs.first() == Some(&0xa0) {
        tbs = skip(tbs)?;
    }
    for _ in 0..4 {
        tbs = skip(tbs)?; // serial, signature, issuer, validity
    }
    let (mut name, _) = tlv(tbs, 0x30)?;
    let mut subject = Subject::default();
    while !name.is_empty() {
        let (set, rest) = tlv(name, 0x31)?;
        name = rest;
        let (atv, _) = tlv(set, 0x30)?;
        let (oid, rest) = tlv(atv, 0x06)?;
        let value = any_tlv(rest).and_then(|(v, _)| std::str::from_utf8(v).ok());
        match (oid, value) {
            ([0x55, 0x04, 0x03], Some(v)) => subject.common_name = v.to_string(),
            ([0x55, 0x04, 0x0a], Some(v)) => subject.organizations.push(v.to_string()),
            _ => {}
        }
    }
    (!subject.common_name.is_empty()).then_some(subject)
}

/// An X.509 certificate's validity (`notBefore`, `notAfter`), as Unix
/// seconds.
pub fn validity(der: &[u8]) -> Option<(i64, i64)> {
    let (cert, _) = tlv(der, 0x30)?;
    let (mut tbs, _) = tlv(cert, 0x30)?;
    if tbs.first() == Some(&0xa0) {
        tbs = skip(tbs)?;
    }
    for _ in 0..3 {
        tbs = skip(tbs)?; // serial, signature, issuer
    }
    let (validity, _) = tlv(tbs, 0x30)?;
    let before = time(validity)?;
    let after = time(skip(validity)?)?;
    Some((before, after))
}

/// One ASN.1 UTCTime or GeneralizedTime as Unix seconds.
fn time(b: &[u8]) -> Option<i64> {
    let tag = *b.first()?;
    let (t, _) = any_tlv(b)?;
    let t = std::str::from_utf8(t).ok()?.strip_suffix('Z')?;
    // UTCTime YYMMDDHHMMSS (years 1950-2049), GeneralizedTime YYYYMMDDHHMMSS.
    let full = match tag {
        0x17 if t.len() == 12 => {
            let yy: i32 = t.get(..2)?.parse().ok()?;
            format!(
                "{}{}",
                if yy >= 50 { 1900 + yy } else { 2000 + yy },
                t.get(2..)?
            )
        }
        0x18 if t.len() == 14 => t.to_string(),
        _ => return None,
    };
    let n = |r: std::ops::Range<usize>| full.get(r).and_then(|s| s.parse::<i8>().ok());
    let year: i16 = full.get(..4)?.parse().ok()?;
    let date = jiff::civil::Date::new(year, n(4..6)?, n(6..8)?).ok()?;
    let time = jiff::civil::Time::new(n(8..10)?, n(10..12)?, n(12..14)?, 0).ok()?;
    let dt = jiff::civil::DateTime::from_parts(date, time);
    dt.to_zoned(jiff::tz::TimeZone::UTC)
        .ok()
        .map(|z| z.timestamp().as_second())
}

/// One DER TLV of any tag: (contents, rest).
fn any_tlv(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let first_len = *b.get(1)?;
    let (len, hdr) = if first_len < 0x80 {
        (first_len as usize, 2)
    } else {
        let n = (first_len & 0x7f) as usize;
        if n == 0 || n > 4 {
            return None;
        }
        let mut len = 0usize;
        for i in 0..n {
            len = (len << 8) | *b.get(2 + i)? as usize;
        }
        (len, 2 + n)
    };
    let end = hdr.checked_add(len)?;
    Some((b.get(hdr..end)?, b.get(end..)?))
}

fn tlv(b: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    (*b.first()? == tag).then(|| any_tlv(b)).flatten()
}

fn skip(b: &[u8]) -> Option<&[u8]> {
    any_tlv(b).map(|(_, rest)| rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_after_reads_the_validity_end() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(vec!["n".into()]).unwrap();
        p.not_after = rcgen::date_time_ymd(2031, 7, 9);
        let cert = p.self_signed(&key).unwrap();
        let want = jiff::civil::date(2031, 7, 9)
            .to_zoned(jiff::tz::TimeZone::UTC)
            .unwrap()
            .timestamp()
            .as_second();
        assert_eq!(validity(cert.der()).map(|(_, end)| end), Some(want));
        let (start, _) = validity(cert.der()).unwrap();
        assert!(start < want);
        assert_eq!(validity(b"garbage"), None);
    }
}
