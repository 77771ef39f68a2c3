//! Certificates and credentials for a local control plane, minted with rcgen.

use std::{
    fs,
    net::{IpAddr, Ipv4Addr},
    path::{Path, PathBuf},
};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use crate::error::Error;

/// The static token the harness authenticates with (group `system:masters`).
pub const ADMIN_TOKEN_USER: &str = "tessera-admin";

/// Files under `<dir>/pki` that the components are started with.
#[derive(Clone, Debug)]
pub struct Pki {
    /// The CA every certificate chains to.
    pub ca_cert: PathBuf,
    /// kube-apiserver's serving certificate and key.
    pub apiserver_cert: PathBuf,
    /// kube-apiserver's serving key.
    pub apiserver_key: PathBuf,
    /// A serving certificate for 127.0.0.1/localhost, for the scheduler,
    /// controller manager and Tessera's own webhook and extender servers.
    pub serving_cert: PathBuf,
    /// The key of `serving_cert`.
    pub serving_key: PathBuf,
    /// Service-account token signing key (private).
    pub sa_key: PathBuf,
    /// Service-account token verification key (public).
    pub sa_pub: PathBuf,
    /// The static token file (`--token-auth-file`).
    pub tokens: PathBuf,
    /// The admin bearer token.
    pub admin_token: String,
}

impl Pki {
    /// Mints a fresh CA, serving certificates, service-account keys and an
    /// admin token under `<dir>/pki`.
    pub fn create(dir: &Path) -> Result<Self, Error> {
        let pki = dir.join("pki");
        fs::create_dir_all(&pki).map_err(Error::io("create directory", &pki))?;
        let write = |name: &str, contents: &str| -> Result<PathBuf, Error> {
            let path = pki.join(name);
            fs::write(&path, contents).map_err(Error::io("write", &path))?;
            Ok(path)
        };

        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "tessera-e2e-ca");
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, ca_key);

        let serving = |cn: &str, dns: &[&str], ips: &[IpAddr]| -> Result<(String, String), Error> {
            let key = KeyPair::generate()?;
            let mut params =
                CertificateParams::new(dns.iter().map(|d| d.to_string()).collect::<Vec<_>>())?;
            params
                .subject_alt_names
                .extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
            params.distinguished_name.push(DnType::CommonName, cn);
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
            let cert = params.signed_by(&key, &issuer)?;
            Ok((cert.pem(), key.serialize_pem()))
        };
        let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let mut apiserver_ips = vec![loopback, IpAddr::V4(Ipv4Addr::new(10, 96, 0, 1))];
        // Pods may reach it (or a proxy serving its certificate,
        // `fault_proxy`) at the host's address too.
        apiserver_ips.extend(
            crate::net::host_ip()
                .ok()
                .and_then(|ip| ip.parse::<IpAddr>().ok()),
        );
        let (apiserver_cert, apiserver_key) = serving(
            "kube-apiserver",
            &[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
            ],
            &apiserver_ips,
        )?;
        let (serving_cert, serving_key) = serving("tessera-local", &["localhost"], &[loopback])?;
        let sa = KeyPair::generate()?;
        let admin_token = random_token()?;

        Ok(Self {
            ca_cert: write("ca.crt", &ca_cert.pem())?,
            apiserver_cert: write("apiserver.crt", &apiserver_cert)?,
            apiserver_key: write("apiserver.key", &apiserver_key)?,
            serving_cert: write("serving.crt", &serving_cert)?,
            serving_key: write("serving.key", &serving_key)?,
            sa_key: write("sa.key", &sa.serialize_pem())?,
            sa_pub: write("sa.pub", &sa.public_key_pem())?,
            tokens: write(
                "tokens.csv",
                &format!(
                    "{admin_token},{ADMIN_TOKEN_USER},uid-{ADMIN_TOKEN_USER},\"system:masters\"\n"
                ),
            )?,
            admin_token,
        })
    }
}

/// 32 random hex characters from the kernel's random pool.
fn random_token() -> Result<String, Error> {
    let path = Path::new("/dev/urandom");
    let mut bytes = [0u8; 16];
    let mut file = fs::File::open(path).map_err(Error::io("open", path))?;
    std::io::Read::read_exact(&mut file, &mut bytes).map_err(Error::io("read", path))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
