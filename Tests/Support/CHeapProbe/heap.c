#include <malloc.h>
#include "CHeapProbe.h"

size_t heap_probe_in_use(void) {
    return mallinfo2().uordblks;
}
