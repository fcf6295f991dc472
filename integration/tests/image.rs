//! The images a node of the test bed runs, built without a registry or a container engine: the
//! driver's must run as the repository's `Dockerfile` says and hold what the binary loads; the
//! HAMi-core install image must hold what the chart's init container runs and copies.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use vgpu_dra_integration::image::{
    HAMI_CORE_INSTALL_FROM, archive_config, dockerfile_config, driver_image, hami_core_image, layer_file, layer_paths,
};

#[test]
fn driver_image_is_laid_out_as_the_dockerfile_says() {
    let binary = vgpu_dra_integration::driver_binary().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let archive = driver_image(binary, "vgpu-dra.test/vgpu-dra:1", dir.path()).unwrap();
    let size = std::fs::metadata(&archive).unwrap().len();
    eprintln!("driver image: {size} bytes, written in {:?}", started.elapsed());
    // Stripping is what keeps the image small enough for a node's import: the binary in it
    // carries no debug sections.
    let inside = dir.path().join("vgpu-dra.in-image");
    std::fs::write(&inside, layer_file(&archive, "/usr/bin/vgpu-dra").unwrap()).unwrap();
    let debug_sections = |path: &Path| {
        let out = Command::new("readelf").args(["-S", "--wide"]).arg(path).output().unwrap();
        assert!(out.status.success(), "readelf {}", path.display());
        // `.debug_gdb_scripts` is loaded at run time and stays; the DWARF sections go.
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains(" .debug_info ") || l.contains(" .debug_line "))
            .count()
    };
    assert!(debug_sections(binary) > 0, "the test binary should carry debug info to be stripped");
    assert_eq!(debug_sections(&inside), 0, "{size} bytes: was the binary stripped?");

    let dockerfile_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Dockerfile");
    let dockerfile = dockerfile_config(&std::fs::read_to_string(&dockerfile_path).unwrap()).unwrap();
    let image = archive_config(&archive).unwrap();
    image.check_matches(&dockerfile).unwrap();
    assert!(image.env.iter().any(|e| e == "MALLOC_ARENA_MAX=1"), "{:?}", image.env);
    assert!(image.env.iter().any(|e| e == "GLIBC_TUNABLES=glibc.malloc.tcache_count=0"), "{:?}", image.env);
    assert_eq!(image.binary, "/usr/bin/vgpu-dra");

    let paths = layer_paths(&archive).unwrap();
    let ldd = Command::new("ldd").arg(binary).output().unwrap();
    assert!(ldd.status.success(), "ldd {}", binary.display());
    let libraries: Vec<String> =
        String::from_utf8_lossy(&ldd.stdout).split_whitespace().filter(|w| w.starts_with('/')).map(str::to_owned).collect();
    assert!(libraries.iter().any(|l| l.contains("libc.so")), "ldd named no C library: {libraries:?}");
    for wanted in libraries.iter().map(String::as_str).chain(["/usr/bin/vgpu-dra", "/etc/passwd", "/tmp", "/home/nonroot"]) {
        assert!(paths.iter().any(|p| p == wanted), "{wanted} is not in the image: {paths:?}");
    }
}

#[test]
fn hami_core_image_holds_the_library_and_a_shell() {
    let dir = tempfile::tempdir().unwrap();
    let stand_in = dir.path().join("libvgpu.so");
    vgpu_dra_integration::node::build_stand_in(&stand_in, &dir.path().join("vgpulock")).unwrap();
    let archive = hami_core_image(&stand_in, "vgpu-dra.test/hami-core:1", dir.path()).unwrap();
    let paths = layer_paths(&archive).unwrap();
    for wanted in [HAMI_CORE_INSTALL_FROM, "/bin/sh", "/bin/cp", "/bin/mv"] {
        assert!(paths.iter().any(|p| p == wanted), "{wanted} is not in the image: {paths:?}");
    }
}
