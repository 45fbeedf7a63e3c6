//! Minimal Level Zero bindings for the calls this package makes, loaded at run time.
//!
//! Why hand-written: the crate registry has no `level-zero-sys`, and the package must import
//! and compile offline on machines without Level Zero, so the loader (`libze_loader.so.1`)
//! is opened with libloading on first use instead of being linked. Layouts follow
//! `level_zero/ze_api.h` (spec 1.x); only the structures used here are declared.

#![allow(non_camel_case_types)]

use libloading::Library;
use std::ffi::{c_char, c_void};

pub type ze_result_t = u32;
pub type Handle = *mut c_void;

pub const ZE_RESULT_SUCCESS: ze_result_t = 0;
pub const ZE_RESULT_ERROR_DEVICE_LOST: ze_result_t = 0x7000_0001;
pub const ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY: ze_result_t = 0x7000_0002;
pub const ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY: ze_result_t = 0x7000_0003;
pub const ZE_RESULT_ERROR_MODULE_BUILD_FAILURE: ze_result_t = 0x7000_0004;
pub const ZE_RESULT_ERROR_MODULE_LINK_FAILURE: ze_result_t = 0x7000_0005;
pub const ZE_RESULT_ERROR_UNINITIALIZED: ze_result_t = 0x7800_0001;
pub const ZE_RESULT_ERROR_UNSUPPORTED_VERSION: ze_result_t = 0x7800_0002;
pub const ZE_RESULT_ERROR_UNSUPPORTED_FEATURE: ze_result_t = 0x7800_0003;
pub const ZE_RESULT_ERROR_INVALID_ARGUMENT: ze_result_t = 0x7800_0004;
pub const ZE_RESULT_ERROR_INVALID_NATIVE_BINARY: ze_result_t = 0x7800_000f;
pub const ZE_RESULT_ERROR_INVALID_KERNEL_NAME: ze_result_t = 0x7800_0011;
pub const ZE_RESULT_ERROR_INVALID_GROUP_SIZE_DIMENSION: ze_result_t = 0x7800_0013;
pub const ZE_RESULT_ERROR_INVALID_MODULE_UNLINKED: ze_result_t = 0x7800_0018;
pub const ZE_RESULT_ERROR_UNKNOWN: ze_result_t = 0x7fff_fffe;

/// The name the spec gives a result code, for messages.
pub fn result_name(r: ze_result_t) -> String {
    match r {
        ZE_RESULT_SUCCESS => "ZE_RESULT_SUCCESS".into(),
        ZE_RESULT_ERROR_DEVICE_LOST => "ZE_RESULT_ERROR_DEVICE_LOST".into(),
        ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY => "ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY".into(),
        ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY => "ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY".into(),
        ZE_RESULT_ERROR_MODULE_BUILD_FAILURE => "ZE_RESULT_ERROR_MODULE_BUILD_FAILURE".into(),
        ZE_RESULT_ERROR_MODULE_LINK_FAILURE => "ZE_RESULT_ERROR_MODULE_LINK_FAILURE".into(),
        ZE_RESULT_ERROR_UNINITIALIZED => "ZE_RESULT_ERROR_UNINITIALIZED".into(),
        ZE_RESULT_ERROR_UNSUPPORTED_VERSION => "ZE_RESULT_ERROR_UNSUPPORTED_VERSION".into(),
        ZE_RESULT_ERROR_UNSUPPORTED_FEATURE => "ZE_RESULT_ERROR_UNSUPPORTED_FEATURE".into(),
        ZE_RESULT_ERROR_INVALID_ARGUMENT => "ZE_RESULT_ERROR_INVALID_ARGUMENT".into(),
        ZE_RESULT_ERROR_INVALID_NATIVE_BINARY => "ZE_RESULT_ERROR_INVALID_NATIVE_BINARY".into(),
        ZE_RESULT_ERROR_INVALID_KERNEL_NAME => "ZE_RESULT_ERROR_INVALID_KERNEL_NAME".into(),
        ZE_RESULT_ERROR_INVALID_GROUP_SIZE_DIMENSION => {
            "ZE_RESULT_ERROR_INVALID_GROUP_SIZE_DIMENSION".into()
        }
        ZE_RESULT_ERROR_INVALID_MODULE_UNLINKED => "ZE_RESULT_ERROR_INVALID_MODULE_UNLINKED".into(),
        ZE_RESULT_ERROR_UNKNOWN => "ZE_RESULT_ERROR_UNKNOWN".into(),
        other => format!("ze_result_t 0x{other:08x}"),
    }
}

pub const ZE_STRUCTURE_TYPE_DRIVER_PROPERTIES: u32 = 0x1;
pub const ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES: u32 = 0x3;
pub const ZE_STRUCTURE_TYPE_DEVICE_COMPUTE_PROPERTIES: u32 = 0x4;
pub const ZE_STRUCTURE_TYPE_CONTEXT_DESC: u32 = 0xd;
pub const ZE_STRUCTURE_TYPE_MODULE_DESC: u32 = 0x1b;
pub const ZE_STRUCTURE_TYPE_KERNEL_DESC: u32 = 0x1d;
pub const ZE_STRUCTURE_TYPE_KERNEL_PROPERTIES: u32 = 0x1e;
/// `ze_device_ip_version_ext_t`, chained to the device properties (`ZE_extension_device_ip_version`).
pub const ZE_STRUCTURE_TYPE_DEVICE_IP_VERSION_EXT: u32 = 0x1000f;
pub const ZE_INIT_FLAG_GPU_ONLY: u32 = 1;
pub const ZE_MODULE_FORMAT_IL_SPIRV: u32 = 0;
pub const ZE_MODULE_FORMAT_NATIVE: u32 = 1;

#[repr(C)]
pub struct ze_driver_properties_t {
    pub stype: u32,
    pub p_next: *mut c_void,
    pub uuid: [u8; 16],
    pub driver_version: u32,
}

#[repr(C)]
pub struct ze_device_properties_t {
    pub stype: u32,
    pub p_next: *mut c_void,
    pub device_type: u32,
    pub vendor_id: u32,
    pub device_id: u32,
    pub flags: u32,
    pub subdevice_id: u32,
    pub core_clock_rate: u32,
    pub max_mem_alloc_size: u64,
    pub max_hardware_contexts: u32,
    pub max_command_queue_priority: u32,
    pub num_threads_per_eu: u32,
    pub physical_eu_simd_width: u32,
    pub num_eus_per_subslice: u32,
    pub num_subslices_per_slice: u32,
    pub num_slices: u32,
    pub timer_resolution: u64,
    pub timestamp_valid_bits: u32,
    pub kernel_timestamp_valid_bits: u32,
    pub uuid: [u8; 16],
    pub name: [c_char; 256],
}

/// The device's graphics IP version (GMDID: architecture, release, revision).
#[repr(C)]
pub struct ze_device_ip_version_ext_t {
    pub stype: u32,
    pub p_next: *const c_void,
    pub ip_version: u32,
}

#[repr(C)]
pub struct ze_device_compute_properties_t {
    pub stype: u32,
    pub p_next: *mut c_void,
    pub max_total_group_size: u32,
    pub max_group_size_x: u32,
    pub max_group_size_y: u32,
    pub max_group_size_z: u32,
    pub max_group_count_x: u32,
    pub max_group_count_y: u32,
    pub max_group_count_z: u32,
    pub max_shared_local_memory: u32,
    pub num_sub_group_sizes: u32,
    pub sub_group_sizes: [u32; 8],
}

#[repr(C)]
pub struct ze_context_desc_t {
    pub stype: u32,
    pub p_next: *const c_void,
    pub flags: u32,
}

#[repr(C)]
pub struct ze_module_desc_t {
    pub stype: u32,
    pub p_next: *const c_void,
    pub format: u32,
    pub input_size: usize,
    pub p_input_module: *const u8,
    pub p_build_flags: *const c_char,
    pub p_constants: *const c_void,
}

#[repr(C)]
pub struct ze_kernel_desc_t {
    pub stype: u32,
    pub p_next: *const c_void,
    pub flags: u32,
    pub p_kernel_name: *const c_char,
}

#[repr(C)]
pub struct ze_kernel_properties_t {
    pub stype: u32,
    pub p_next: *mut c_void,
    pub num_kernel_args: u32,
    pub required_group_size_x: u32,
    pub required_group_size_y: u32,
    pub required_group_size_z: u32,
    pub required_num_sub_groups: u32,
    pub required_subgroup_size: u32,
    pub max_subgroup_size: u32,
    pub max_num_subgroups: u32,
    pub local_mem_size: u32,
    pub private_mem_size: u32,
    pub spill_mem_size: u32,
    pub uuid_kid: [u8; 16],
    pub uuid_mid: [u8; 16],
}

/// Zero-initialise a plain C structure (all fields are integers, arrays or pointers).
pub fn zeroed<T>() -> T {
    // SAFETY: only used for the repr(C) structs above, for which all-zero bytes are valid.
    unsafe { std::mem::zeroed() }
}

macro_rules! api {
    ($($field:ident = $symbol:literal : fn($($arg:ty),*);)*) => {
        /// The loader's entry points, resolved once.
        pub struct Api {
            _lib: Library,
            $(pub $field: unsafe extern "C" fn($($arg),*) -> ze_result_t,)*
        }

        impl Api {
            /// Open the Level Zero loader and resolve every entry point used.
            pub fn load(path: &str) -> Result<Api, String> {
                // SAFETY: opening Intel's loader runs its initialisers; nothing else.
                let lib = unsafe { Library::new(path) }.map_err(|e| e.to_string())?;
                // SAFETY: the symbol types follow ze_api.h.
                unsafe {
                    $(let $field = *lib
                        .get::<unsafe extern "C" fn($($arg),*) -> ze_result_t>($symbol)
                        .map_err(|e| e.to_string())?;)*
                    Ok(Api { _lib: lib, $($field,)* })
                }
            }
        }
    };
}

api! {
    init = b"zeInit\0": fn(u32);
    driver_get = b"zeDriverGet\0": fn(*mut u32, *mut Handle);
    driver_get_properties = b"zeDriverGetProperties\0": fn(Handle, *mut ze_driver_properties_t);
    device_get = b"zeDeviceGet\0": fn(Handle, *mut u32, *mut Handle);
    device_get_properties = b"zeDeviceGetProperties\0": fn(Handle, *mut ze_device_properties_t);
    device_get_compute_properties =
        b"zeDeviceGetComputeProperties\0": fn(Handle, *mut ze_device_compute_properties_t);
    context_create = b"zeContextCreate\0": fn(Handle, *const ze_context_desc_t, *mut Handle);
    module_create =
        b"zeModuleCreate\0": fn(Handle, Handle, *const ze_module_desc_t, *mut Handle, *mut Handle);
    module_destroy = b"zeModuleDestroy\0": fn(Handle);
    module_dynamic_link = b"zeModuleDynamicLink\0": fn(u32, *mut Handle, *mut Handle);
    build_log_get_string = b"zeModuleBuildLogGetString\0": fn(Handle, *mut usize, *mut c_char);
    build_log_destroy = b"zeModuleBuildLogDestroy\0": fn(Handle);
    module_get_native_binary = b"zeModuleGetNativeBinary\0": fn(Handle, *mut usize, *mut u8);
    module_get_kernel_names = b"zeModuleGetKernelNames\0": fn(Handle, *mut u32, *mut *const c_char);
    kernel_create = b"zeKernelCreate\0": fn(Handle, *const ze_kernel_desc_t, *mut Handle);
    kernel_destroy = b"zeKernelDestroy\0": fn(Handle);
    kernel_get_properties = b"zeKernelGetProperties\0": fn(Handle, *mut ze_kernel_properties_t);
}
