//! Closed sets of words a manifest accepts (`state`, `discard`, `aio`, `bios`, ...).
//!
//! Shared by the raw types (so the decoder and the JSON Schema list the accepted words) and the
//! validated types (a value of these enums is valid by construction).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `spec.state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PowerState {
    /// Running.
    Started,
    /// Shut down.
    Stopped,
}

/// A disk's `discard`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Discard {
    /// `ignore`.
    Ignore,
    /// `on`.
    On,
}

/// A disk's `aio`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Aio {
    /// `native`.
    Native,
    /// `threads`.
    Threads,
    /// `io_uring`.
    IoUring,
}

/// `hardware.machine`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Machine {
    /// `i440fx`.
    I440fx,
    /// `q35`.
    Q35,
}

/// `hardware.bios`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Bios {
    /// `seabios`.
    Seabios,
    /// `ovmf`.
    Ovmf,
}

/// `cdrom.media`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Media {
    /// `cdrom`.
    Cdrom,
    /// `disk`.
    Disk,
}

/// `efi-disk.template`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum EfiTemplate {
    /// `byos`.
    #[serde(rename = "byos")]
    Byos,
    /// `2m`.
    #[serde(rename = "2m")]
    TwoM,
    /// `4m`.
    #[serde(rename = "4m")]
    FourM,
    /// `8m`.
    #[serde(rename = "8m")]
    EightM,
}

/// `efi-disk.secure-boot`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SecureBoot {
    /// Pre-enrolled keys.
    Enabled,
    /// No pre-enrolled keys.
    Disabled,
}

/// `tpm.version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum TpmVersion {
    /// `v1.2`.
    #[serde(rename = "v1.2")]
    V12,
    /// `v2.0`.
    #[serde(rename = "v2.0")]
    V20,
}

/// `spec.arch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    /// `amd64`.
    Amd64,
    /// `i386`.
    I386,
    /// `arm64`.
    Arm64,
    /// `armhf`.
    Armhf,
    /// `riscv32`.
    Riscv32,
    /// `riscv64`.
    Riscv64,
}

/// `checksum.algorithm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ChecksumAlgorithm {
    /// MD5.
    Md5,
    /// SHA-1.
    Sha1,
    /// SHA-224.
    Sha224,
    /// SHA-256.
    Sha256,
    /// SHA-384.
    Sha384,
    /// SHA-512.
    Sha512,
}
