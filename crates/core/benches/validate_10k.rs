//! Benchmark (not a test): load + validate + level a composition-mode repository of 10,000
//! resources, the size issue 2 sets the 300 ms budget for.
//!
//! The repository is generated in memory: 5,000 VMs and 3,000 LXCs spread over 20 nodes, and
//! 2,000 artifacts (ISOs, DiskImages, CTTemplates) each on five nodes; guests reference artifacts
//! on their own node and some depend on earlier guests, so the graph has several levels. Most
//! files hold one document; CTTemplates and the first VMs share files several to a file. Run with
//! `cargo bench -p proxops-core --bench validate_10k`; it prints the minimum and median of
//! several runs of [`proxops_core::load`].
//!
//! With `PROXOPS_BENCH_WRITE_REPO=<dir>` it writes the repository under `<dir>` instead and
//! exits: `benches/validate_process.sh` times the whole `proxops validate <dir>` process.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};

const NODES: usize = 20;
const VMS: usize = 5_000;
const LXCS: usize = 3_000;
const ISOS: usize = 700;
const DISK_IMAGES: usize = 700;
const CT_TEMPLATES: usize = 600;
/// Nodes each artifact is declared on.
const ARTIFACT_NODES: usize = 5;
/// Documents per file where files hold several.
const PER_FILE: usize = 10;
const RUNS: usize = 15;

fn node(i: usize) -> String {
    format!("pve{:02}", i % NODES + 1)
}

/// Nodes of artifact `j`: its home node `j % 20` and the next four.
fn artifact_nodes(j: usize) -> String {
    (0..ARTIFACT_NODES)
        .map(|k| node(j + k))
        .collect::<Vec<_>>()
        .join(", ")
}

/// An artifact index of a kind with `count` artifacts whose home node is guest `i`'s node.
fn artifact_for(i: usize, count: usize) -> usize {
    (i % NODES + NODES * ((i / NODES) % (count / NODES))) % count
}

fn artifact(kind: &str, name: &str, j: usize, filename: &str) -> String {
    format!(
        "apiVersion: proxops/v1alpha1\nkind: {kind}\nmetadata:\n  name: {name}\nspec:\n  nodes: \
         [{nodes}]\n  storage: local\n  filename: {filename}\n  url: \
         https://mirror.example.org/images/{filename}\n  checksum:\n    algorithm: sha256\n    \
         value: {sum:064x}\n",
        nodes = artifact_nodes(j),
        sum = j + 1,
    )
}

fn vm(i: usize) -> String {
    let mut doc = format!(
        "apiVersion: proxops/v1alpha1\nkind: VM\nmetadata:\n  name: vm-{i:05}\n  labels:\n    \
         role: app\n"
    );
    // Every tenth VM waits for the VM ten before it, in chains of eight: the graph gets the
    // depth of a large real repository without being one long line.
    if i.is_multiple_of(10) && !(i / 10).is_multiple_of(8) {
        let _ = write!(
            doc,
            "  annotations:\n    proxops/depends-on: \"VM:vm-{:05}\"\n",
            i - 10
        );
    }
    let _ = write!(
        doc,
        "spec:\n  node: {node}\n  vmid: {vmid}\n  memory: 4GiB\n  cpu:\n    type: host\n    \
         cores: 2\n  disks:\n    - storage: local-lvm\n      image: image-{image:04}\n      \
         size: 32GiB\n      discard: \"on\"\n      ssd: true\n    - storage: local-lvm\n      \
         size: 100GiB\n      interface: scsi1\n  networks:\n    - bridge: vmbr0\n      vlan: \
         20\n      firewall: true\n  hardware:\n    machine: q35\n    cloud-init:\n      \
         enabled: true\n      storage: local-lvm\n",
        node = node(i),
        vmid = 10_000 + i,
        image = artifact_for(i, DISK_IMAGES),
    );
    if i.is_multiple_of(4) {
        let _ = writeln!(
            doc,
            "    cdrom:\n      iso: iso-{:04}",
            artifact_for(i, ISOS)
        );
    }
    let _ = write!(
        doc,
        "  options:\n    onboot: true\n    agent: true\n  cloud-init-data:\n    ci-user: debian\n    \
         ssh-keys:\n      - ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIC0ZgqgQ4bbJ7r4ZbhzN1xQ3bq4jbq9QXsQ8nKX6pQ3l \
         ops@example.org\n    ipconfigs:\n      - nic: 0\n        ip: 10.{a}.{b}.{c}/16\n        \
         gateway: 10.{a}.0.1\n  tags: [app, bench]\n",
        a = i / 65_536 + 1,
        b = (i / 256) % 256,
        c = i % 256,
    );
    doc
}

fn lxc(i: usize) -> String {
    let mut doc =
        format!("apiVersion: proxops/v1alpha1\nkind: LXC\nmetadata:\n  name: ct-{i:05}\n");
    // Every fifth container waits for a VM on its node.
    if i.is_multiple_of(5) {
        let _ = write!(
            doc,
            "  annotations:\n    proxops/depends-on: \"VM:vm-{:05}\"\n",
            i % VMS
        );
    }
    let _ = write!(
        doc,
        "spec:\n  node: {node}\n  vmid: {vmid}\n  template: ctt-{ctt:04}\n  memory: 512MiB\n  \
         swap: 512MiB\n  cpu:\n    cores: 1\n  root:\n    storage: local-lvm\n    size: 8GiB\n  \
         networks:\n    - bridge: vmbr0\n      ip: dhcp\n  dns:\n    nameservers: [10.0.0.53]\n  \
         options:\n    unprivileged: true\n    nesting: true\n",
        node = node(i),
        vmid = 20_000 + i,
        ctt = artifact_for(i, CT_TEMPLATES),
    );
    doc
}

/// The generated repository, keyed by path.
fn repository() -> BTreeMap<String, String> {
    let mut files = BTreeMap::new();
    let mut add = |path: String, contents: String| {
        files.insert(path, contents);
    };
    for j in 0..ISOS {
        let doc = artifact(
            "ISO",
            &format!("iso-{j:04}"),
            j,
            &format!("installer-{j:04}.iso"),
        );
        add(format!("iso/base/iso-{j:04}.yaml"), doc);
    }
    for j in 0..DISK_IMAGES {
        let name = format!("image-{j:04}");
        let doc = artifact("DiskImage", &name, j, &format!("cloud-{j:04}.qcow2"));
        add(format!("diskimage/base/{name}.yaml"), doc);
    }
    for first in (0..CT_TEMPLATES).step_by(PER_FILE) {
        let docs: Vec<String> = (first..first + PER_FILE)
            .map(|j| {
                artifact(
                    "CTTemplate",
                    &format!("ctt-{j:04}"),
                    j,
                    &format!("ct-{j:04}.tar.zst"),
                )
            })
            .collect();
        add(
            format!("ctt/base/templates-{first:04}.yaml"),
            docs.join("---\n"),
        );
    }
    // The first 500 VMs five to a file, the rest one per file.
    for first in (0..500).step_by(5) {
        let docs: Vec<String> = (first..first + 5).map(vm).collect();
        add(format!("vm/prod/group-{first:05}.yaml"), docs.join("---\n"));
    }
    for i in 500..VMS {
        add(format!("vm/prod/vm-{i:05}.yaml"), vm(i));
    }
    for i in 0..LXCS {
        add(format!("lxc/prod/ct-{i:05}.yaml"), lxc(i));
    }
    let listed: Vec<String> = files
        .keys()
        .map(|path| format!("  - ../../{path}\n"))
        .collect();
    files.insert(
        "clusters/prod/resources.yaml".to_owned(),
        format!("resources:\n{}", listed.concat()),
    );
    files.insert(
        "clusters/prod/config.yaml".to_owned(),
        "pve: {}\n".to_owned(),
    );
    files
}

fn millis(duration: Duration) -> String {
    format!("{:.1} ms", duration.as_secs_f64() * 1e3)
}

/// Runs `work` [`RUNS`] times and renders min, median and max.
fn time<T>(mut work: impl FnMut() -> T) -> String {
    let mut times: Vec<Duration> = (0..RUNS)
        .map(|_| {
            let start = Instant::now();
            std::hint::black_box(work());
            start.elapsed()
        })
        .collect();
    times.sort();
    format!(
        "min {}, median {}, max {} over {RUNS} runs",
        millis(times[0]),
        millis(times[RUNS / 2]),
        millis(times[RUNS - 1])
    )
}

#[allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]
fn main() -> ExitCode {
    let files = repository();
    if let Some(dir) = std::env::var_os("PROXOPS_BENCH_WRITE_REPO") {
        let dir = std::path::PathBuf::from(dir);
        for (path, contents) in &files {
            let file = dir.join(path);
            let written = file
                .parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|()| std::fs::write(&file, contents));
            if let Err(error) = written {
                println!("writing {}: {error}", file.display());
                return ExitCode::FAILURE;
            }
        }
        println!(
            "validate_10k: wrote {} files under {}",
            files.len(),
            dir.display()
        );
        return ExitCode::SUCCESS;
    }
    let bytes: usize = files.values().map(String::len).sum();
    println!(
        "validate_10k: {} files, {:.1} MiB of YAML",
        files.len(),
        bytes as f64 / 1048576.0
    );

    let warm_up = proxops_core::load(&files);
    let errors: Vec<String> = warm_up
        .diagnostics
        .iter()
        .filter(|d| d.is_error())
        .map(ToString::to_string)
        .collect();
    let resources: usize = warm_up.states.iter().map(|s| s.manifest.len()).sum();
    let levels: usize = warm_up.states.iter().map(|s| s.levels.len()).sum();
    println!(
        "  {resources} resources, {levels} levels, {} errors",
        errors.len()
    );
    for error in errors.iter().take(5) {
        println!("  {error}");
    }

    let load = time(|| proxops_core::load(&files));
    println!("  load + validate + levels: {load}");
    // The share of the time spent parsing single files, to tell whose code to look at.
    let parse = time(|| {
        files
            .iter()
            .filter(|(path, _)| !path.starts_with("clusters/"))
            .map(|(path, contents)| proxops_core::manifest::parse_file(path, contents))
            .collect::<Vec<_>>()
    });
    println!("  of which parse_file of every manifest file: {parse}");
    // The floor under both: granit's YAML events alone (no tree, no checks), one file after
    // another on one core; what `validate` cannot go below without another parser.
    let events = time(|| {
        files
            .iter()
            .filter(|(path, _)| !path.starts_with("clusters/"))
            .map(|(_, contents)| {
                serde_saphyr::granit_parser::Parser::new_from_str(contents)
                    .map_while(Result::ok)
                    .count()
            })
            .sum::<usize>()
    });
    println!("  of which granit's events alone, one file after another: {events}");
    if errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
