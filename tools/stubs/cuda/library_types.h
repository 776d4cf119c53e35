#ifndef PYCUDNN_STUB_LIBRARY_TYPES_H
#define PYCUDNN_STUB_LIBRARY_TYPES_H
typedef enum libraryPropertyType_t { MAJOR_VERSION = 0, MINOR_VERSION = 1, PATCH_LEVEL = 2 } libraryPropertyType;
#endif
