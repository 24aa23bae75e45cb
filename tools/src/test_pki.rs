//! Certificates made at test time, for TLS tests on loopback: a CA, and server certificates it
//! signs — valid, expired, or naming another host — as rustls server settings. Nothing is
//! read from or written to disk unless a test writes the CA's PEM (for a client's `ca_file`).

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use std::sync::Arc;

/// How long a server certificate is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validity {
    /// From yesterday for a year.
    Current,
    /// In 2020 only: expired.
    Expired,
}

/// A test CA.
pub struct TestPki {
    ca_pem: String,
    ca_der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for TestPki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestPki").finish_non_exhaustive()
    }
}

impl TestPki {
    /// A new CA ("weir test CA"), its key in memory only.
    pub fn new() -> TestPki {
        let key = KeyPair::generate().expect("a CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, "weir test CA");
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let cert = params.self_signed(&key).expect("the CA certificate");
        TestPki { ca_pem: cert.pem(), ca_der: cert.der().clone(), issuer: Issuer::new(params, key) }
    }

    /// The CA's certificate (PEM), for a client's trust store.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Server settings with a certificate for `names` (DNS names or IP addresses), signed by
    /// this CA, valid or not per `validity`; the chain holds the CA too.
    pub fn server(&self, names: &[&str], validity: Validity) -> Arc<rustls::ServerConfig> {
        let key = KeyPair::generate().expect("a server key");
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).expect("server parameters");
        params.distinguished_name.push(DnType::CommonName, "weir test server");
        match validity {
            Validity::Current => {
                let now = std::time::SystemTime::now();
                params.not_before = (now - std::time::Duration::from_secs(86_400)).into();
                params.not_after = (now + std::time::Duration::from_secs(365 * 86_400)).into();
            }
            Validity::Expired => {
                params.not_before = rcgen::date_time_ymd(2020, 1, 1);
                params.not_after = rcgen::date_time_ymd(2020, 12, 31);
            }
        }
        let cert = params.signed_by(&key, &self.issuer).expect("the server certificate");
        let chain = vec![cert.der().clone(), self.ca_der.clone()];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("a server certificate rustls accepts");
        Arc::new(config)
    }
}

impl Default for TestPki {
    fn default() -> Self {
        TestPki::new()
    }
}
