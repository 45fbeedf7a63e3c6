//! Level Zero: the loader opened at run time, devices, and module/kernel handles that are
//! released exactly once.
//!
//! `XPU_ZEBIN_SIMULATED_DEVICE=pvc` puts the Intel driver's debug keys in the environment
//! before the loader is opened (`simulation.rs`), so the real driver and IGC run without a
//! GPU (AUB capture mode, docs/design.md §4): modules build and kernels can be inspected;
//! nothing executes. One Level Zero attempt is `build.rs`; `compile_and_load`, `load.rs`;
//! the loader's C interface, `ffi.rs`.

pub mod build;
pub mod ffi;
pub mod load;
mod simulation;

pub use simulation::{prepare_simulation, worker_env, SIMULATED_DEVICE_ENV};

use crate::error::{BuildError, ErrorKind, Result};
use ffi::{zeroed, Api, Handle};
use serde::Serialize;
use std::ffi::{CStr, CString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

const LOADER: &str = "libze_loader.so.1";

fn no_device(message: impl Into<String>) -> BuildError {
    BuildError::new(ErrorKind::NoDevice, message)
}

/// A device the driver reports.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceInfo {
    pub index: usize,
    pub name: String,
    pub device_id: u32,
    pub vendor_id: u32,
    /// The graphics IP version (GMDID) the driver reports; 0 when it reports none.
    pub ip_version: u32,
    /// Short architecture name, as upstream spells it (e.g. "pvc"): from the IP version,
    /// else from the PCI device id.
    pub arch: Option<String>,
    pub max_work_group_size: u32,
    pub sub_group_sizes: Vec<u32>,
    pub simulated: bool,
    /// The driver's version (`major.minor.build`, as upstream's `driver_version`): part of
    /// the binary cache key and of target profiles.
    pub driver: String,
}

struct Device {
    handle: Handle,
    context: Handle,
    info: DeviceInfo,
}

/// The initialised driver: the loader's entry points and every device with a context.
pub struct Runtime {
    pub api: Api,
    devices: Vec<Device>,
}

// SAFETY: Level Zero handles are opaque pointers that the spec allows to be used from any
// thread; this struct never mutates after initialisation.
unsafe impl Send for Runtime {}
unsafe impl Sync for Runtime {}

static RUNTIME: OnceLock<std::result::Result<Runtime, BuildError>> = OnceLock::new();

/// The graphics IP version (GMDID) -> architecture, as upstream names it (its SYCL
/// architecture enum carries the same number): architecture in bits 31-22, release in
/// 21-14, revision in 5-0.
fn arch_of_ip(ip_version: u32) -> Option<&'static str> {
    let (arch, release) = (ip_version >> 22, (ip_version >> 14) & 0xff);
    Some(match (arch, release) {
        (12, 60 | 61) => "pvc",
        (12, 55..=57) => "dg2",
        (12, 70 | 71) => "mtl",
        (12, 74) => "arl_h",
        (20, 1 | 2) => "bmg",
        (20, 4) => "lnl",
        _ => return None,
    })
}

/// PCI device ids -> architecture: for drivers that report no IP version.
fn arch_of_pci(device_id: u32) -> Option<&'static str> {
    Some(match device_id {
        0x0bd0..=0x0bdb => "pvc",
        0x5690..=0x56ff => "dg2",
        0xe202..=0xe22f => "bmg",
        0x64a0..=0x64b0 => "lnl",
        0x7d40..=0x7dff => "mtl",
        _ => return None,
    })
}

fn check(api_result: ffi::ze_result_t, what: &str) -> Result<()> {
    if api_result == ffi::ZE_RESULT_SUCCESS {
        Ok(())
    } else {
        Err(no_device(format!(
            "{what} failed: {}",
            ffi::result_name(api_result)
        )))
    }
}

fn init() -> Result<Runtime> {
    let simulated = prepare_simulation()?;
    let api = Api::load(LOADER).map_err(|e| {
        BuildError::new(
            ErrorKind::ToolchainMissing,
            format!(
                "the Level Zero loader ({LOADER}) cannot be opened: {e} \
                 (Debian: apt-get install libze1 intel-opencl-icd)"
            ),
        )
    })?;
    // SAFETY: plain calls into the loader with valid out-pointers.
    let r = unsafe { (api.init)(ffi::ZE_INIT_FLAG_GPU_ONLY) };
    if r != ffi::ZE_RESULT_SUCCESS {
        let hint = if simulated.is_none() {
            format!(" (without a GPU, set {SIMULATED_DEVICE_ENV}=pvc to use a simulated one)")
        } else {
            String::new()
        };
        return Err(no_device(format!(
            "zeInit found no Intel GPU driver: {}{hint}",
            ffi::result_name(r)
        )));
    }
    let mut devices = Vec::new();
    for driver in handles(|n, out| unsafe { (api.driver_get)(n, out) }, "zeDriverGet")? {
        driver_devices(&api, driver, simulated.is_some(), &mut devices)?;
    }
    if devices.is_empty() {
        return Err(no_device("the Level Zero driver reports no GPU device"));
    }
    Ok(Runtime { api, devices })
}

/// The handles a Level Zero `get(count, out)` call lists.
fn handles(
    get: impl Fn(&mut u32, *mut Handle) -> ffi::ze_result_t,
    what: &str,
) -> Result<Vec<Handle>> {
    let mut count = 0u32;
    check(get(&mut count, std::ptr::null_mut()), what)?;
    let mut list = vec![std::ptr::null_mut(); count as usize];
    check(get(&mut count, list.as_mut_ptr()), what)?;
    list.truncate(count as usize);
    Ok(list)
}

/// One driver's devices, each with a context, appended to `devices`.
fn driver_devices(
    api: &Api,
    driver: Handle,
    simulated: bool,
    devices: &mut Vec<Device>,
) -> Result<()> {
    // SAFETY: plain calls into the loader with valid out-pointers and a driver it listed.
    unsafe {
        let mut dprops: ffi::ze_driver_properties_t = zeroed();
        dprops.stype = ffi::ZE_STRUCTURE_TYPE_DRIVER_PROPERTIES;
        check(
            (api.driver_get_properties)(driver, &mut dprops),
            "zeDriverGetProperties",
        )?;
        // The version as SYCL and upstream's `driver_version` spell it (major.minor.build).
        // Not the UUID: measured here, its bytes change between processes.
        let v = dprops.driver_version;
        let driver_id = format!("{}.{}.{}", v >> 24, (v >> 16) & 0xff, v & 0xffff);
        let desc = ffi::ze_context_desc_t {
            stype: ffi::ZE_STRUCTURE_TYPE_CONTEXT_DESC,
            p_next: std::ptr::null(),
            flags: 0,
        };
        let mut context = std::ptr::null_mut();
        check(
            (api.context_create)(driver, &desc, &mut context),
            "zeContextCreate",
        )?;
        let listed = handles(|n, out| (api.device_get)(driver, n, out), "zeDeviceGet")?;
        for handle in listed {
            let mut info = device_info(api, handle)?;
            info.index = devices.len();
            info.simulated = simulated;
            info.driver = driver_id.clone();
            devices.push(Device {
                handle,
                context,
                info,
            });
        }
    }
    Ok(())
}

/// What one device reports: name, ids, IP version and architecture, work-group and
/// sub-group sizes.
fn device_info(api: &Api, handle: Handle) -> Result<DeviceInfo> {
    // SAFETY: plain calls into the loader with valid out-pointers and chained structs that
    // outlive the calls.
    unsafe {
        let mut ip: ffi::ze_device_ip_version_ext_t = zeroed();
        ip.stype = ffi::ZE_STRUCTURE_TYPE_DEVICE_IP_VERSION_EXT;
        let mut props: ffi::ze_device_properties_t = zeroed();
        props.stype = ffi::ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES;
        props.p_next = (&mut ip as *mut ffi::ze_device_ip_version_ext_t).cast();
        check(
            (api.device_get_properties)(handle, &mut props),
            "zeDeviceGetProperties",
        )?;
        let mut compute: ffi::ze_device_compute_properties_t = zeroed();
        compute.stype = ffi::ZE_STRUCTURE_TYPE_DEVICE_COMPUTE_PROPERTIES;
        check(
            (api.device_get_compute_properties)(handle, &mut compute),
            "zeDeviceGetComputeProperties",
        )?;
        let sizes = compute.num_sub_group_sizes.min(8) as usize;
        Ok(DeviceInfo {
            index: 0,
            name: CStr::from_ptr(props.name.as_ptr())
                .to_string_lossy()
                .into_owned(),
            device_id: props.device_id,
            vendor_id: props.vendor_id,
            ip_version: ip.ip_version,
            arch: arch_of_ip(ip.ip_version)
                .or_else(|| arch_of_pci(props.device_id))
                .map(str::to_string),
            max_work_group_size: compute.max_total_group_size,
            sub_group_sizes: compute.sub_group_sizes[..sizes].to_vec(),
            simulated: false,
            driver: String::new(),
        })
    }
}

/// The process's Level Zero runtime, initialised on first use.
pub fn runtime() -> Result<&'static Runtime> {
    RUNTIME.get_or_init(init).as_ref().map_err(Clone::clone)
}

/// Every device, or why there is none.
pub fn devices() -> Result<Vec<DeviceInfo>> {
    Ok(runtime()?.devices.iter().map(|d| d.info.clone()).collect())
}

// Handle accounting, so tests can prove every create has its destroy.
pub static MODULES_CREATED: AtomicU64 = AtomicU64::new(0);
pub static MODULES_DESTROYED: AtomicU64 = AtomicU64::new(0);
pub static KERNELS_CREATED: AtomicU64 = AtomicU64::new(0);
pub static KERNELS_DESTROYED: AtomicU64 = AtomicU64::new(0);

/// (modules created, destroyed, kernels created, destroyed) in this process.
pub fn handle_counts() -> (u64, u64, u64, u64) {
    (
        MODULES_CREATED.load(Ordering::Relaxed),
        MODULES_DESTROYED.load(Ordering::Relaxed),
        KERNELS_CREATED.load(Ordering::Relaxed),
        KERNELS_DESTROYED.load(Ordering::Relaxed),
    )
}

/// A module handle, destroyed on drop.
pub struct Module {
    rt: &'static Runtime,
    pub handle: Handle,
}

/// A kernel handle, destroyed on drop (before its module: keep it declared first).
pub struct Kernel {
    rt: &'static Runtime,
    pub handle: Handle,
}

// SAFETY: see Runtime; a handle is owned by exactly one of these and destroyed once.
unsafe impl Send for Module {}
unsafe impl Sync for Module {}
unsafe impl Send for Kernel {}
unsafe impl Sync for Kernel {}

impl Drop for Kernel {
    fn drop(&mut self) {
        // SAFETY: the handle came from zeKernelCreate and is destroyed only here.
        unsafe { (self.rt.api.kernel_destroy)(self.handle) };
        KERNELS_DESTROYED.fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: the handle came from zeModuleCreate and is destroyed only here.
        unsafe { (self.rt.api.module_destroy)(self.handle) };
        MODULES_DESTROYED.fetch_add(1, Ordering::Relaxed);
    }
}

/// Take a build log's text and release the log.
fn take_log(rt: &Runtime, log: Handle) -> String {
    if log.is_null() {
        return String::new();
    }
    // SAFETY: size query then fill, per the spec; the log is destroyed once.
    unsafe {
        let mut size = 0usize;
        let mut text = String::new();
        if (rt.api.build_log_get_string)(log, &mut size, std::ptr::null_mut()) == 0 && size > 0 {
            let mut buf = vec![0u8; size];
            if (rt.api.build_log_get_string)(log, &mut size, buf.as_mut_ptr().cast()) == 0 {
                text = String::from_utf8_lossy(&buf)
                    .trim_end_matches('\0')
                    .to_string();
            }
        }
        (rt.api.build_log_destroy)(log);
        text
    }
}

impl Runtime {
    fn device(&self, index: usize) -> Result<&Device> {
        self.devices.get(index).ok_or_else(|| {
            no_device(format!(
                "device {index} does not exist: the driver reports {} device(s)",
                self.devices.len()
            ))
        })
    }

    pub fn device_info(&self, index: usize) -> Result<&DeviceInfo> {
        Ok(&self.device(index)?.info)
    }

    /// `zeModuleCreate`: the module and the build log's text, or the result code and log.
    pub fn create_module(
        &'static self,
        device: usize,
        input: &[u8],
        is_spv: bool,
        build_flags: &str,
    ) -> Result<(Module, String), (ffi::ze_result_t, String)> {
        let d = self
            .device(device)
            .map_err(|e| (ffi::ZE_RESULT_ERROR_INVALID_ARGUMENT, e.message))?;
        // A NUL would cut the flags the driver sees: refused (callers check it first too).
        let flags = CString::new(build_flags).map_err(|_| {
            (
                ffi::ZE_RESULT_ERROR_INVALID_ARGUMENT,
                "build flags hold a NUL character".to_string(),
            )
        })?;
        let desc = ffi::ze_module_desc_t {
            stype: ffi::ZE_STRUCTURE_TYPE_MODULE_DESC,
            p_next: std::ptr::null(),
            format: if is_spv {
                ffi::ZE_MODULE_FORMAT_IL_SPIRV
            } else {
                ffi::ZE_MODULE_FORMAT_NATIVE
            },
            input_size: input.len(),
            p_input_module: input.as_ptr(),
            p_build_flags: flags.as_ptr(),
            p_constants: std::ptr::null(),
        };
        let mut module = std::ptr::null_mut();
        let mut log = std::ptr::null_mut();
        // SAFETY: desc points at live buffers for the call; out-pointers are valid.
        let r =
            unsafe { (self.api.module_create)(d.context, d.handle, &desc, &mut module, &mut log) };
        let text = take_log(self, log);
        if r != ffi::ZE_RESULT_SUCCESS {
            if !module.is_null() {
                // SAFETY: a failed create may still hand back a module; release it.
                unsafe { (self.api.module_destroy)(module) };
            }
            return Err((r, text));
        }
        MODULES_CREATED.fetch_add(1, Ordering::Relaxed);
        Ok((
            Module {
                rt: self,
                handle: module,
            },
            text,
        ))
    }
}

impl Module {
    /// Names of the kernels the module defines.
    pub fn kernel_names(&self) -> Vec<String> {
        // SAFETY: count query then fill; the names are owned by the module.
        unsafe {
            let mut count = 0u32;
            if (self.rt.api.module_get_kernel_names)(self.handle, &mut count, std::ptr::null_mut())
                != 0
            {
                return Vec::new();
            }
            let mut names = vec![std::ptr::null(); count as usize];
            if (self.rt.api.module_get_kernel_names)(self.handle, &mut count, names.as_mut_ptr())
                != 0
            {
                return Vec::new();
            }
            names
                .into_iter()
                .filter(|p| !p.is_null())
                .map(|p| CStr::from_ptr(p).to_string_lossy().into_owned())
                .collect()
        }
    }

    /// The device binary the driver built (`zeModuleGetNativeBinary`).
    pub fn native_binary(&self) -> Vec<u8> {
        // SAFETY: size query then fill.
        unsafe {
            let mut size = 0usize;
            if (self.rt.api.module_get_native_binary)(self.handle, &mut size, std::ptr::null_mut())
                != 0
            {
                return Vec::new();
            }
            let mut buf = vec![0u8; size];
            if (self.rt.api.module_get_native_binary)(self.handle, &mut size, buf.as_mut_ptr()) != 0
            {
                return Vec::new();
            }
            buf.truncate(size);
            buf
        }
    }

    /// The link log of a module with unresolved imports: the driver names them there.
    pub fn link_log(&self) -> (ffi::ze_result_t, String) {
        let mut handle = self.handle;
        let mut log = std::ptr::null_mut();
        // SAFETY: one module handle, a valid out-pointer for the log.
        let r = unsafe { (self.rt.api.module_dynamic_link)(1, &mut handle, &mut log) };
        (r, take_log(self.rt, log))
    }

    pub fn create_kernel(&self, name: &str) -> std::result::Result<Kernel, ffi::ze_result_t> {
        let cname = CString::new(name).map_err(|_| ffi::ZE_RESULT_ERROR_INVALID_KERNEL_NAME)?;
        let desc = ffi::ze_kernel_desc_t {
            stype: ffi::ZE_STRUCTURE_TYPE_KERNEL_DESC,
            p_next: std::ptr::null(),
            flags: 0,
            p_kernel_name: cname.as_ptr(),
        };
        let mut kernel = std::ptr::null_mut();
        // SAFETY: desc and name live across the call.
        let r = unsafe { (self.rt.api.kernel_create)(self.handle, &desc, &mut kernel) };
        if r != ffi::ZE_RESULT_SUCCESS {
            return Err(r);
        }
        KERNELS_CREATED.fetch_add(1, Ordering::Relaxed);
        Ok(Kernel {
            rt: self.rt,
            handle: kernel,
        })
    }
}

impl Kernel {
    pub fn properties(&self) -> std::result::Result<ffi::ze_kernel_properties_t, ffi::ze_result_t> {
        let mut props: ffi::ze_kernel_properties_t = zeroed();
        props.stype = ffi::ZE_STRUCTURE_TYPE_KERNEL_PROPERTIES;
        // SAFETY: valid kernel handle and out-pointer.
        let r = unsafe { (self.rt.api.kernel_get_properties)(self.handle, &mut props) };
        if r == ffi::ZE_RESULT_SUCCESS {
            Ok(props)
        } else {
            Err(r)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn architecture_from_the_ip_version_then_the_pci_id() {
        let gmdid = |arch: u32, release: u32, revision: u32| arch << 22 | release << 14 | revision;
        assert_eq!(arch_of_ip(gmdid(12, 60, 7)), Some("pvc")); // 0x030f0007
        assert_eq!(arch_of_ip(0x030f_0007), Some("pvc"));
        assert_eq!(arch_of_ip(gmdid(20, 1, 4)), Some("bmg")); // 0x05004004
        assert_eq!(arch_of_ip(0x0500_4004), Some("bmg"));
        assert_eq!(arch_of_ip(gmdid(20, 4, 0)), Some("lnl"));
        assert_eq!(arch_of_ip(gmdid(12, 56, 5)), Some("dg2"));
        assert_eq!(arch_of_ip(0), None); // the bookworm driver reports none
        assert_eq!(arch_of_pci(0x0bd5), Some("pvc"));
        assert_eq!(arch_of_pci(0x1234), None);
    }
}
