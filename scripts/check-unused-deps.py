#!/usr/bin/env python3
"""Fails when a workspace crate declares a dependency its code never names.

For every member of the workspace, each dependency of [dependencies] must be named by the
crate's code (src/, tests/, examples/, benches/, build.rs), each of [dev-dependencies] by
its tests, examples or benches (or by #[cfg(test)] code in src/), each of
[build-dependencies] by build.rs. "Named" means the crate's Rust identifier appears as a
word (a `use`, a path, a derive, a macro). A dependency that is needed without being
named (a feature switch, a linked library) is listed under
[package.metadata.cargo-machete] ignored = ["name"] in that crate's Cargo.toml, the key
cargo-machete reads, with a comment saying why.

A textual check, like cargo-machete's: no build, so it runs in a second. Usage:
    scripts/check-unused-deps.py [--help]
"""

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def rust_files(crate: Path, parts):
    for part in parts:
        path = crate / part
        if path.is_file():
            yield path
        elif path.is_dir():
            yield from path.rglob("*.rs")


def named(ident: str, files) -> bool:
    word = re.compile(rf"(?<![A-Za-z0-9_]){re.escape(ident)}(?![A-Za-z0-9_])")
    return any(word.search(f.read_text(encoding="utf-8")) for f in files)


def check(crate: Path) -> list[str]:
    manifest = tomllib.loads((crate / "Cargo.toml").read_text(encoding="utf-8"))
    ignored = set(
        manifest.get("package", {})
        .get("metadata", {})
        .get("cargo-machete", {})
        .get("ignored", [])
    )
    code = ["src", "tests", "examples", "benches", "build.rs"]
    sections = {
        "dependencies": code,
        "dev-dependencies": ["src", "tests", "examples", "benches"],
        "build-dependencies": ["build.rs"],
    }
    unused = []
    for section, parts in sections.items():
        files = list(rust_files(crate, parts))
        for name in manifest.get(section, {}):
            if name in ignored:
                continue
            if not named(name.replace("-", "_"), files):
                unused.append(f"{crate.relative_to(ROOT)}: [{section}] {name}")
    return unused


def main() -> int:
    if len(sys.argv) > 1:
        print(__doc__.strip())
        return 0 if sys.argv[1] in ("-h", "--help") else 2
    workspace = tomllib.loads((ROOT / "Cargo.toml").read_text(encoding="utf-8"))
    unused = []
    for member in workspace["workspace"]["members"]:
        unused += check(ROOT / member)
    if unused:
        print("dependencies no code names (remove them, or list them under "
              "[package.metadata.cargo-machete] ignored with the reason):")
        for line in unused:
            print(f"  {line}")
        return 1
    print(f"unused dependencies: none ({len(workspace['workspace']['members'])} crates)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
