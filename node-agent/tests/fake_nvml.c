/* A stand-in for libnvidia-ml.so.1 with NVML's signatures and struct layouts (from nvml.h), for
 * testing the agent's NVML binding on machines without a GPU: two devices, the second of which
 * refuses power readings the way boards without a power sensor do. */
#include <stdio.h>

typedef struct { unsigned int gpu; unsigned int memory; } nvmlUtilization_t;
typedef struct { unsigned long long total; unsigned long long free; unsigned long long used; } nvmlMemory_t;
typedef void *nvmlDevice_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3

static int initialised = 0;

static unsigned long index_of(nvmlDevice_t d) { return (unsigned long)d - 1; }

int nvmlInit_v2(void) { initialised = 1; return NVML_SUCCESS; }

int nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    *count = 2;
    return NVML_SUCCESS;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (index >= 2) return NVML_ERROR_INVALID_ARGUMENT;
    *device = (nvmlDevice_t)(unsigned long)(index + 1);
    return NVML_SUCCESS;
}

int nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    snprintf(uuid, length, "GPU-fake-%lu", index_of(device));
    return NVML_SUCCESS;
}

int nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *u) {
    u->gpu = 37 + (unsigned int)index_of(device);
    u->memory = 5;
    return NVML_SUCCESS;
}

int nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *m) {
    (void)device;
    m->total = 150754820096ULL;
    m->used = 1073741824ULL;
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

int nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *milliwatts) {
    if (index_of(device) == 1) return NVML_ERROR_NOT_SUPPORTED;
    *milliwatts = 312500;
    return NVML_SUCCESS;
}

int nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *milliwatts) {
    (void)device;
    *milliwatts = 700000;
    return NVML_SUCCESS;
}

int nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned int *celsius) {
    (void)device;
    if (sensor != 0) return NVML_ERROR_INVALID_ARGUMENT;
    *celsius = 45;
    return NVML_SUCCESS;
}
