//! Kunlunxin XPUs, whole and as vXPUs: HAMi's `kunlun:` section
//! (`pkg/device/kunlun`).

mod admit;
mod read;

use k8s_openapi::api::core::v1::Container;
use tessera_api::{
    names::kunlun::{
        ALLOCATED, DEVICE_IDX, HANDSHAKE, REGISTER, VXPU_TYPE, XPU_MEMORY_MIB, XPU_TYPE,
    },
    v1alpha1::{DeviceFamily, DeviceSlice},
};

use super::{Annotations, Binding, Family, Handoff, Parsed, Quota, Source, SourceKind};
use crate::request::types::{ContainerKind, ContainerRequest};
use crate::request::vendors::KunlunConfig;

impl Family for KunlunConfig {
    fn id(&self) -> DeviceFamily {
        DeviceFamily::Kunlunxin
    }

    fn resources(&self) -> Vec<&str> {
        vec![
            &self.resource_count_name,
            &self.resource_vcount_name,
            &self.resource_vmemory_name,
        ]
    }

    fn parse(
        &self,
        container: &Container,
        kind: ContainerKind,
        annotations: Annotations<'_>,
        parsed: &mut Parsed,
    ) {
        parsed.take(read::parse_xpu(container, kind, self, annotations));
        parsed.take(read::parse_vxpu(container, kind, self, annotations));
    }

    /// Whole XPUs from the count resource alone (`<node>-kunlun-<i>`,
    /// 98,304 MiB each); vXPUs from HAMi's JSON register
    /// (`hami.io/node-register-xpu`), with its handshake.
    fn sources(&self) -> Vec<Source> {
        vec![
            Source::new(
                DeviceFamily::Kunlunxin,
                &self.resource_count_name,
                SourceKind::Cards {
                    memory_mib: XPU_MEMORY_MIB,
                    infix: "kunlun",
                },
            )
            .device_type(XPU_TYPE),
            Source::new(
                DeviceFamily::Kunlunxin,
                &self.resource_vcount_name,
                SourceKind::Json,
            )
            .register(REGISTER)
            .handshake(HANDSHAKE)
            .device_type(VXPU_TYPE),
        ]
    }

    fn admit_container(&self, container: &mut Container, wanted: &ContainerRequest) {
        admit::container(self, container, wanted);
    }

    fn quota(&self) -> Vec<Quota<'_>> {
        vec![Quota::of(&self.resource_vmemory_name, 1, "")]
    }

    /// Only vXPUs (cards of one slice size) count; whole XPUs do not.
    fn counts_quota(&self, request: &ContainerRequest) -> bool {
        request.vendor.as_ref().is_some_and(|v| v.same_size)
    }
    /// Whole XPUs: the card indexes of the last container with XPUs
    /// (`BAIDU_COM_DEVICE_IDX`) and HAMi's `kunlun-allocated` list, no
    /// lock. vXPUs: HAMi's two `xpu` lists and the Node's mutex lock.
    fn hand_off(&self, binding: &Binding<'_>, out: &mut Handoff) {
        let xpu = |d: &DeviceSlice| d.family == DeviceFamily::Kunlunxin && d.model != VXPU_TYPE;
        let vxpu = |d: &DeviceSlice| d.family == DeviceFamily::Kunlunxin && d.model == VXPU_TYPE;
        if binding.any(xpu) {
            if let Some(indexes) = binding.last_indexes(xpu) {
                out.pod(DEVICE_IDX, indexes);
            }
            out.pod(ALLOCATED, binding.encode(xpu, |_| XPU_TYPE, |d| d.cores));
        }
        if binding.any(vxpu) {
            out.lists("xpu", binding.encode(vxpu, |_| VXPU_TYPE, |d| d.cores));
            out.mutex_lock(binding);
        }
    }
}
