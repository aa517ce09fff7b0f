#include <stddef.h>

/// Bytes the C allocator has handed out and not taken back (glibc's
/// `mallinfo2().uordblks`): the heap in use, whatever RSS says.
size_t heap_probe_in_use(void);
