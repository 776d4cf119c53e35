/* Hermetic libc stand-in (LP64). libclang's wheel ships no resource headers; without this,
 * clang silently turns size_t into int. The generator maps these by typedef name, not by size. */
#ifndef PYCUDNN_STUB_STDDEF_H
#define PYCUDNN_STUB_STDDEF_H
typedef unsigned long size_t;
#define NULL ((void *)0)
#endif
