//! README stays true: its example manifests are the files in `examples/`, byte for byte.

use crate::support::repo_root;

#[test]
fn readme_shows_the_example_manifests_exactly() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let mut checked = 0;
    let mut rest = readme.as_str();
    while let Some(start) = rest.find("<!-- example: ") {
        rest = &rest[start + "<!-- example: ".len()..];
        let end = rest.find(" -->").unwrap();
        let file = &rest[..end];
        let block_start = rest.find("```yaml\n").unwrap() + "```yaml\n".len();
        let block_end = block_start + rest[block_start..].find("```\n").unwrap();
        let shown = &rest[block_start..block_end];
        let actual = std::fs::read_to_string(repo_root().join("examples").join(file)).unwrap();
        assert_eq!(shown, actual, "README's copy of examples/{file} differs");
        checked += 1;
    }
    let on_disk = walk_yaml(&repo_root().join("examples"));
    assert_eq!(checked, on_disk, "README shows every example manifest");
}

fn walk_yaml(dir: &std::path::Path) -> usize {
    let mut count = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            count += walk_yaml(&path);
        } else if path.extension().is_some_and(|e| e == "yaml") {
            count += 1;
        }
    }
    count
}
