//! `cargo bench`: the engine's pieces and one small compile through each backend, on the
//! real compilers. The `compile` group puts the backends side by side so their ratio is read
//! from one run: one-shot ocloc (upstream's approach) against the persistent worker, the
//! Level Zero JIT (simulated PVC device) and a warm cache hit.
//!
//! Needs `ocloc` on PATH (scripts/install-toolchain.sh). The worker backend needs a Python
//! with this package installed: `$XPU_ZEBIN_BENCH_PYTHON`, else `.venv/bin/python`.

use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::Duration;
use xpu_zebin::classify::{classify_failure, Exit};
use xpu_zebin::engine::{compile, CompileRequest};
use xpu_zebin::{ocloc, pool, spirv, ze, zebin};

const ADD: &str = "__kernel void add(__global const float* a, __global const float* b, \
                   __global float* c) { int i = get_global_id(0); c[i] = a[i] + b[i]; }";

/// OpenCL C with `values` floats live across a loop (register pressure), as in samples.py.
fn pressure_kernel(values: usize) -> String {
    let mut s = String::from(
        "__attribute__((intel_reqd_sub_group_size(32)))\n__kernel void pressure(__global const float* in, __global float* out, int n) {\n int gid = get_global_id(0);\n",
    );
    for j in 0..values {
        s += &format!(" float v{j} = in[gid + {j}];\n");
    }
    s += " for (int it = 0; it < n; ++it) {\n";
    for j in 0..values {
        s += &format!(
            "  v{j} = fma(v{j}, v{}, v{});\n",
            (j + 1) % values,
            (j + 7) % values
        );
    }
    s += " }\n float s = 0.0f;\n";
    for j in 0..values {
        s += &format!(" s += v{j};\n");
    }
    s + " out[gid] = s;\n}\n"
}

/// Point the engine's persistent workers at a Python that has this package, if any.
fn configure_worker_python() -> bool {
    let python = std::env::var_os("XPU_ZEBIN_BENCH_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python"));
    let probe = Command::new(&python)
        .args([
            "-c",
            "import os, sys, xpu_zebin; print(os.path.realpath(sys.executable)); print(os.pathsep.join(sys.path))",
        ])
        .output();
    let Some(out) = probe.ok().filter(|o| o.status.success()) else {
        eprintln!(
            "worker backend skipped: no Python with xpu_zebin at {}",
            python.display()
        );
        return false;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    let (Some(executable), Some(pythonpath)) = (lines.next(), lines.next()) else {
        return false;
    };
    pool::configure(pool::PythonRuntime {
        executable: executable.into(),
        pythonpath: pythonpath.into(),
    });
    true
}

fn benches(c: &mut Criterion) {
    let ocloc_path = ocloc::discover(None).expect("ocloc on PATH (scripts/install-toolchain.sh)");
    let add = ocloc::opencl_to_spirv(&ocloc_path, ADD, "pvc", "", &AtomicBool::new(false))
        .expect("add kernel SPIR-V");
    let heavy = ocloc::opencl_to_spirv(
        &ocloc_path,
        &pressure_kernel(300),
        "pvc",
        "",
        &AtomicBool::new(false),
    )
    .expect("pressure kernel SPIR-V");
    let request = |spirv: &[u8]| {
        let mut r = CompileRequest::new(spirv.to_vec(), "pvc");
        r.options.ocloc = Some(ocloc_path.clone());
        r.options.cache = false;
        r.options.speculative = Some(false);
        r
    };
    std::env::set_var(pool::PERSISTENT_ENV, "0");
    let add_zebin = compile(&request(&add), false, &AtomicBool::new(false))
        .expect("add compiles")
        .binary;
    let ptss_log = "warning: in kernel 'K': [RetryManager] Start recompilation of the kernel\n\
        error: in kernel 'K': total scratch space exceeds HW supported limit: 265792 bytes (max permitted PTSS 262144 bytes)\n\
        error: backend compiler failed build.\nBuild failed with error code: -11";

    let mut g = c.benchmark_group("engine");
    g.bench_function("validate_spirv_100k", |b| {
        b.iter(|| spirv::validate(black_box(&heavy)).unwrap())
    });
    // What a cache hit reads of the same module (its key's part): against the line above.
    g.bench_function("scan_spirv_100k", |b| {
        b.iter(|| spirv::scan(black_box(&heavy)).unwrap())
    });
    g.bench_function("parse_zebin", |b| {
        b.iter(|| zebin::parse(black_box(&add_zebin)).unwrap())
    });
    g.bench_function("classify_ptss_log", |b| {
        b.iter(|| classify_failure(Exit::Code(245), black_box(ptss_log)))
    });
    g.finish();
    compile_small_kernel(c, &add, &add_zebin, &request);
    pool::shutdown();
}

fn compile_small_kernel(
    c: &mut Criterion,
    add: &[u8],
    add_zebin: &[u8],
    request: &dyn Fn(&[u8]) -> CompileRequest,
) {
    let cancel = AtomicBool::new(false);

    let mut g = c.benchmark_group("compile_small_kernel");
    g.sample_size(10).measurement_time(Duration::from_secs(4));
    g.bench_function("ocloc_one_shot", |b| {
        std::env::set_var(pool::PERSISTENT_ENV, "0");
        b.iter(|| compile(&request(add), false, &cancel).unwrap())
    });
    if configure_worker_python() {
        std::env::set_var(pool::PERSISTENT_ENV, "1");
        compile(&request(add), false, &cancel).expect("worker warm-up");
        g.bench_function("ocloc_persistent_worker", |b| {
            b.iter(|| compile(&request(add), false, &cancel).unwrap())
        });
    }
    let cache_dir = tempfile::tempdir().unwrap();
    let mut cached = request(add);
    cached.options.cache = true;
    cached.options.cache_dir = Some(cache_dir.path().to_path_buf());
    compile(&cached, false, &cancel).expect("fill the cache");
    g.bench_function("warm_cache_hit", |b| {
        b.iter(|| compile(&cached, false, &cancel).unwrap())
    });

    std::env::set_var(ze::SIMULATED_DEVICE_ENV, "pvc");
    let load = |is_spv: bool, isolated: bool, binary: &[u8]| {
        let mut r = ze::load::LoadRequest::new(binary.to_vec(), "add");
        r.is_spv = is_spv;
        r.options.isolated = Some(isolated);
        r.options.cache = false;
        r
    };
    let load_now = |r: ze::load::LoadRequest| ze::load::compile_and_load(&r, &cancel);
    match load_now(load(true, false, add)) {
        Ok(_) => {
            g.bench_function("level_zero_jit_in_process", |b| {
                b.iter(|| load_now(load(true, false, add)).unwrap())
            });
            if load_now(load(true, true, add)).is_ok() {
                g.bench_function("level_zero_jit_isolated", |b| {
                    b.iter(|| load_now(load(true, true, add)).unwrap())
                });
            }
            g.bench_function("level_zero_native_load", |b| {
                b.iter(|| load_now(load(false, false, add_zebin)).unwrap())
            });
        }
        Err(f) => eprintln!("Level Zero backend skipped: {}", f.error),
    }
    g.finish();
}

criterion_group!(compile_benches, benches);
criterion_main!(compile_benches);
