# relpos.pc's lines that depend on the configuration (cmake/relpos.pc.in):
#  RELPOS_PC_CFLAGS            the public compile definitions (as the CMake target's), each after a space
#  RELPOS_PC_REQUIRES_PRIVATE  the .pc modules of a static librelpos's private dependencies
#  RELPOS_PC_LIBS_PRIVATE      the libraries and flags of those without a .pc module
# A shared librelpos records its private dependencies itself (DT_NEEDED), so both private lines
# stay empty; a static one leaves them to the consumer's link: `pkg-config --static --libs relpos`.

set(RELPOS_PC_CFLAGS "")
if(NOT RELPOS_IMAGE_CODECS)
  string(APPEND RELPOS_PC_CFLAGS " -DRELPOS_NO_IMAGE_CODECS=1")
endif()
if(RELPOS_WITH_CUDA)
  string(APPEND RELPOS_PC_CFLAGS " -DRELPOS_WITH_CUDA=1")
endif()

# A library file as the linker's -L/-l flags (a list) (-L left out for the compiler's own search path), or
# as it is when it is no library file (a flag, a bare name).
function(relpos_pc_link_flags out lib)
  if(lib MATCHES "^(.*)/lib([^/]+)\\.(so|a)(\\.[0-9.]+)?$")
    set(dir "${CMAKE_MATCH_1}")
    set(flags "-l${CMAKE_MATCH_2}")
    if(NOT dir IN_LIST CMAKE_CXX_IMPLICIT_LINK_DIRECTORIES)
      set(flags "-L${dir}" ${flags})
    endif()
  elseif(lib MATCHES "^-")
    set(flags "${lib}")
  else()
    set(flags "-l${lib}")
  endif()
  set(${out} "${flags}" PARENT_SCOPE)
endfunction()

set(RELPOS_PC_REQUIRES_PRIVATE "")
set(RELPOS_PC_LIBS_PRIVATE "")
if(NOT RELPOS_SHARED)
  set(_relpos_pc_libs ${DNNL_LIBRARY})
  # zlib ships a .pc module nearly everywhere; where it does not, link its library directly
  find_package(PkgConfig QUIET)
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(RELPOS_PC_ZLIB QUIET zlib)
  endif()
  if(RELPOS_PC_ZLIB_FOUND)
    list(APPEND RELPOS_PC_REQUIRES_PRIVATE zlib)
  else()
    list(APPEND _relpos_pc_libs ${ZLIB_LIBRARIES})
  endif()
  if(RELPOS_WITH_CUDA)
    list(APPEND _relpos_pc_libs ${CUDA_cudart_LIBRARY} ${CUDA_cublas_LIBRARY} ${CUDNN_LIBRARY})
  endif()
  if(RELPOS_WITH_NCCL)
    list(APPEND _relpos_pc_libs ${NCCL_LIBRARY})
  endif()
  if(RELPOS_WITH_MPI)
    list(APPEND _relpos_pc_libs ${MPI_CXX_LIBRARIES})
  endif()
  list(APPEND _relpos_pc_libs ${CMAKE_DL_LIBS})  # dladdr (models_dir); in libc since glibc 2.34
  foreach(_lib IN LISTS _relpos_pc_libs)
    relpos_pc_link_flags(_flags "${_lib}")
    list(APPEND RELPOS_PC_LIBS_PRIVATE ${_flags})
  endforeach()
  # (one -L per folder: the first occurrence of each flag is kept)
  # OpenMP last: -fopenmp links libgomp, which oneDNN's and our parallel loops need
  list(APPEND RELPOS_PC_LIBS_PRIVATE ${OpenMP_CXX_FLAGS})
  if(RELPOS_WITH_MPI AND MPI_CXX_LINK_FLAGS)
    list(APPEND RELPOS_PC_LIBS_PRIVATE ${MPI_CXX_LINK_FLAGS})
  endif()
  list(REMOVE_DUPLICATES RELPOS_PC_LIBS_PRIVATE)
endif()
list(JOIN RELPOS_PC_REQUIRES_PRIVATE " " RELPOS_PC_REQUIRES_PRIVATE)
list(JOIN RELPOS_PC_LIBS_PRIVATE " " RELPOS_PC_LIBS_PRIVATE)
